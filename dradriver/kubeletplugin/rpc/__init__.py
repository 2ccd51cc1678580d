"""The plugin's own gRPC server over HTTP/2 (server.py) and gRPC's framing (framing.py)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from dradriver.kubeletplugin.rpc.server import Context, Method, RpcServer

__all__ = ["Context", "Method", "RpcServer", "service"]


def service(module: ModuleType, name: str, impl: Any) -> dict[str, Method]:
    """The methods of service `name` in the generated module `module`, served by the
    attributes of `impl` named like them: paths and message types come from the proto
    descriptor, so they cannot drift from the .proto files."""
    desc = module.DESCRIPTOR.services_by_name[name]
    return {
        f"/{desc.full_name}/{m.name}": Method(
            parse=getattr(module, m.input_type.name).FromString,
            call=getattr(impl, m.name),
            streaming=m.server_streaming,
        )
        for m in desc.methods
    }
