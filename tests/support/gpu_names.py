"""Tests speak of GPUs by NVML index ("gpu-0", "gpu-1-mig-3g40gb-4"): the scenario is
written that way. Device names follow the GPU's UUID (dradriver.inventory.naming), so
each test turns its index-style names into the node's real ones through the names the
node's own discovery produced (or the fake's UUIDs for a spec and node), and back for
comparing what the code wrote."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dradriver.inventory.model import Gpu, Inventory
from dradriver.inventory.naming import stable_names

INDEXED = re.compile(r"\bgpu-(\d{1,2})(?![0-9a-z])")


def fake_names(spec: str, node: str) -> list[str]:
    """The whole-GPU names, by NVML index, of a fake machine `spec` on `node`."""
    from fakenvml.spec import parse
    from fakenvml.topology import build

    uuids = [g.uuid for g in build(parse(spec), node)]
    names = stable_names(uuids)
    return [names[u] for u in uuids]


def names_of(source: Inventory | Sequence[Gpu] | Mapping[str, Any]) -> list[str]:
    """The whole-GPU names by NVML index: from an inventory, its GPUs, or a device map
    (name -> NodeDevice)."""
    if isinstance(source, Inventory):
        gpus: Iterable[Gpu] = source.gpus
    elif isinstance(source, Mapping):
        gpus = {d.gpu.index: d.gpu for d in source.values()}.values()
    else:
        gpus = source
    from dradriver.inventory.node_devices import gpu_device_name

    by_index = {g.index: gpu_device_name(g) for g in gpus}
    return [by_index[i] for i in sorted(by_index)]


def real(text: str, names: Sequence[str]) -> str:
    """ "gpu-0-mig-3g40gb-4" -> "gpu-6fafa41b-mig-3g40gb-4"."""
    return INDEXED.sub(lambda m: names[int(m[1])], text)


def indexed(text: str, names: Sequence[str]) -> str:
    """The reverse of real(): the node's names back in index form."""
    for i, name in enumerate(names):
        text = re.sub(rf"\b{re.escape(name)}(?![0-9a-z])", f"gpu-{i}", text)
    return text
