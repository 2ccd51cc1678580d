"""Short names for the generated kubelet gRPC protocol modules.

The code itself lives in :mod:`dradriver.api.gen` and is generated from
``api/kubelet/**/*.proto`` by ``tools/genproto.py`` (``make proto``).

- ``registration`` / ``registration_grpc``: plugin registration
  (``pluginregistration.Registration``), served on the socket in the
  kubelet's plugin registry directory.
- ``dra_v1`` / ``dra_v1_grpc`` and ``dra_v1beta1`` / ``dra_v1beta1_grpc``: the
  DRA node service (``NodePrepareResources`` / ``NodeUnprepareResources``);
  both versions carry the same messages and can be served side by side.
- ``health_v1`` / ``health_v1_grpc`` and ``health_v1alpha1`` /
  ``health_v1alpha1_grpc``: the optional device health stream
  (``NodeWatchResources``); both versions carry the same messages (v1 is what
  1.37 kubelets prefer, v1alpha1 what 1.34 to 1.36 call).
- ``podresources_v1`` / ``podresources_v1_grpc``: the kubelet's PodResources API
  (``List``), which it serves and others call: what each running container holds,
  claims' devices with their driver, pool and name included (what NVIDIA's dcgm-exporter
  reads to attribute a GPU's metrics to a pod).

The plugin serves these with grpcio's asyncio server (kubeletplugin/grpc_edge/), through
the generated ``add_*Servicer_to_server`` functions; the tests and benchmarks call the
sockets with the generated stubs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

# Loaded on first use: the plugin's startup needs the registration and DRA modules
# before anything else, and no process needs all twelve.
_MODULES = {
    "dra_v1": "dra.v1.api_pb2",
    "dra_v1_grpc": "dra.v1.api_pb2_grpc",
    "dra_v1beta1": "dra.v1beta1.api_pb2",
    "dra_v1beta1_grpc": "dra.v1beta1.api_pb2_grpc",
    "health_v1": "drahealth.v1.api_pb2",
    "health_v1_grpc": "drahealth.v1.api_pb2_grpc",
    "health_v1alpha1": "drahealth.v1alpha1.api_pb2",
    "health_v1alpha1_grpc": "drahealth.v1alpha1.api_pb2_grpc",
    "podresources_v1": "podresources.v1.api_pb2",
    "podresources_v1_grpc": "podresources.v1.api_pb2_grpc",
    "registration": "pluginregistration.v1.api_pb2",
    "registration_grpc": "pluginregistration.v1.api_pb2_grpc",
}

if TYPE_CHECKING:
    from dradriver.api.gen.kubelet.dra.v1 import api_pb2 as dra_v1
    from dradriver.api.gen.kubelet.dra.v1 import api_pb2_grpc as dra_v1_grpc
    from dradriver.api.gen.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
    from dradriver.api.gen.kubelet.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
    from dradriver.api.gen.kubelet.drahealth.v1 import api_pb2 as health_v1
    from dradriver.api.gen.kubelet.drahealth.v1 import api_pb2_grpc as health_v1_grpc
    from dradriver.api.gen.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
    from dradriver.api.gen.kubelet.drahealth.v1alpha1 import (
        api_pb2_grpc as health_v1alpha1_grpc,
    )
    from dradriver.api.gen.kubelet.pluginregistration.v1 import api_pb2 as registration
    from dradriver.api.gen.kubelet.pluginregistration.v1 import (
        api_pb2_grpc as registration_grpc,
    )
    from dradriver.api.gen.kubelet.podresources.v1 import api_pb2 as podresources_v1
    from dradriver.api.gen.kubelet.podresources.v1 import (
        api_pb2_grpc as podresources_v1_grpc,
    )


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"dradriver.api.gen.kubelet.{_MODULES[name]}")
    globals()[name] = module
    return module


#: PluginInfo.type announced by a DRA driver to the kubelet's plugin watcher.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"

#: PluginInfo.supported_versions entries naming the services the driver
#: serves, spelled the way the kubelet expects them (version + service name,
#: not the full proto package).
DRA_V1: Final = "v1.DRAPlugin"
DRA_V1BETA1: Final = "v1beta1.DRAPlugin"
# The health services' names are their full gRPC names (their packages are bare
# versions), exactly the kubelet's DRAResourceHealthService constants.
DRA_HEALTH_V1: Final = "v1.DRAResourceHealth"
DRA_HEALTH_V1ALPHA1: Final = "v1alpha1.DRAResourceHealth"

__all__ = [
    "DRA_HEALTH_V1",
    "DRA_HEALTH_V1ALPHA1",
    "DRA_PLUGIN_TYPE",
    "DRA_V1",
    "DRA_V1BETA1",
    "dra_v1",
    "dra_v1_grpc",
    "dra_v1beta1",
    "dra_v1beta1_grpc",
    "health_v1",
    "health_v1_grpc",
    "health_v1alpha1",
    "health_v1alpha1_grpc",
    "podresources_v1",
    "podresources_v1_grpc",
    "registration",
    "registration_grpc",
]
