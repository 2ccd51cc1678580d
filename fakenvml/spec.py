"""The machine a fake NVML library emulates, from a `fake:` device spec.

Shorthand (the `fake:` prefix is optional here):

    spec    := [ "driver=" VERSION ";" ] group ( "+" group )*  |  "@" PATH
    group   := [ COUNT "x" ] PRODUCT [ ":" option ( "," option )* ]
    option  := "nvlink=" ( "none" | "pairs" | "quads" | "all" | "fabric" )
             | "mig=" ( "on" | "off" )
             | "cluster=" NAME | "clique=" INT          (nvlink=fabric only)
             | "absent=" INT                            (a GPU missing from its slot)

    8xH100-80GB                      one HGX board: 8 GPUs on NVSwitch
    4xA100-80GB+2xL4                 two groups; GPU indices run on across groups
    4xA100-80GB:nvlink=pairs,mig=on  NVLink bridges between GPU 2k and 2k+1, MIG enabled
    8xH100-80GB:absent=3             the same board with its fourth GPU gone
    driver=570.158.01;4xGB200        one GB200 tray on that driver (default: 570.86.15)

Products (case-insensitive; facts and sources in products.py): A100-40GB, A100-80GB, A30,
H100-80GB, H100-NVL, GH200-96GB, GH200-144GB, H200-141GB, H200-NVL, H20, B200, GB200, B300,
RTX-PRO-6000, L40S, A10, L4, T4.
nvlink: none = no NVLink; pairs = 2-way bridges between GPU 2k and 2k+1 of the group;
quads = 4-way bridges joining GPUs 4k..4k+3 (H200 NVL); all = every GPU of the group on
NVSwitch (links end at NVSwitch PCI endpoints, as on HGX boards); fabric = all (where the
board has NVSwitches), plus nvmlDeviceGetGpuFabricInfoV reports a completed fabric whose
clusterUuid (derived from `cluster`, default: node and group) and cliqueId (`clique`,
default 1) the group shares, as on GH200 and GB200 NVL72 racks. Defaults: the product's
usual wiring (all for HGX boards, pairs for H100 NVL, quads for H200 NVL, fabric for GH200
and GB200, none for PCIe cards without bridges; a bridged group whose count the bridge does
not divide gets pairs where it can, else none); mig=off.

absent: the group's GPU in slot N (0-based, of COUNT slots) is missing, as when a GPU
fell off the bus before a reboot or was taken out: NVML enumerates one GPU fewer and
every later GPU's NVML index shifts down, while each remaining GPU keeps its PCI address,
minor number (the driver numbers /dev/nvidiaN by slot here), UUID and NVLinks to the GPUs
still there. A GPU's identity derives from (node, group, product, slot), never from its
NVML index, so `8xH100-80GB` and `8xH100-80GB:absent=3` describe the same seven GPUs.

`@PATH` reads a YAML fleet file (relative paths from the working directory):

    driverVersion: "570.86.15"      # optional, nvmlSystemGetDriverVersion
    cudaDriverVersion: 12080        # optional, nvmlSystemGetCudaDriverVersion
    gpus:                           # required: groups, in GPU index order
      - product: A100-80GB          # required
        count: 4                    # optional, default 1
        nvlink: pairs               # optional, as above
        mig: on                     # optional: on/off or true/false
        cluster: rack-7             # optional, nvlink: fabric only
        clique: 2                   # optional, nvlink: fabric only
        absent: [3]                 # optional: slots (0-based) whose GPU is missing
        migDevices:                 # optional, needs mig on: present at first start
          - gpu: 0                  # slot of the GPU within this group
            profile: 3g.40gb        # a GPU-instance profile name of the product
            placement: 4            # memory-slice start of the instance
            computeInstances: [1, 1, 1]   # optional: compute-instance sizes in slices

Each entry is a GPU instance; by default with one full-size compute instance (one MIG
device). `computeInstances` lists the sizes of the compute instances to create in it
instead, as `nvidia-smi mig -cci 0,0,0 -gi 1` creates three 1-slice ones (each then a MIG
device of its own, e.g. `1c.3g.40gb`); `[]` leaves the GPU instance without any (no
usable MIG device, yet its memory slices are taken). Errors are
FakeSpecError (a ValueError) and name the offending group or YAML field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from fakenvml import mig_rules
from fakenvml.products import PRODUCTS, Product, product

MAX_GPUS = 64


class FakeSpecError(ValueError):
    pass


class NvLink(Enum):
    NONE = "none"
    PAIRS = "pairs"
    QUADS = "quads"
    ALL = "all"
    FABRIC = "fabric"

    @property
    def bridge_size(self) -> int:
        """GPUs joined by one NVLink bridge (0: no bridges)."""
        return {NvLink.PAIRS: 2, NvLink.QUADS: 4}.get(self, 0)


def _default_link(p: Product, count: int) -> NvLink:
    link = NvLink(p.default_nvlink)
    while link.bridge_size and count % link.bridge_size:
        link = NvLink.PAIRS if link is NvLink.QUADS else NvLink.NONE
    return link


@dataclass(frozen=True)
class MigDeviceSpec:
    gpu: int  # index within its group
    profile: str
    placement: int
    # Compute-instance sizes in slices; None: one full-size compute instance.
    compute_instances: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GpuGroup:
    product: Product
    count: int
    nvlink: NvLink
    mig: bool
    cluster: str | None = None
    clique: int | None = None
    mig_devices: tuple[MigDeviceSpec, ...] = ()
    # Slots (0-based, of `count`) whose GPU is missing: see the module docstring.
    absent: frozenset[int] = frozenset()

    @property
    def present(self) -> list[int]:
        """The slots that hold a GPU, in NVML enumeration (PCI bus) order."""
        return [s for s in range(self.count) if s not in self.absent]


@dataclass(frozen=True)
class MachineSpec:
    groups: tuple[GpuGroup, ...]
    driver_version: str | None = None
    cuda_driver_version: int | None = None

    @property
    def gpu_count(self) -> int:
        """GPUs NVML enumerates: the slots that hold one."""
        return sum(len(g.present) for g in self.groups)

    @property
    def slot_count(self) -> int:
        return sum(g.count for g in self.groups)


def parse(spec: str) -> MachineSpec:
    text = spec.strip().removeprefix("fake:").strip()
    if not text:
        raise FakeSpecError("empty device spec: expected e.g. 8xH100-80GB or @fleet.yaml")
    if text.startswith("@"):
        return parse_yaml_file(Path(text[1:]))
    driver = None
    if text.startswith("driver="):
        head, sep, text = text.partition(";")
        driver = head.removeprefix("driver=").strip()
        if not sep or not re.fullmatch(r"\d+\.\d+(\.\d+)?", driver):
            raise FakeSpecError(
                f"{head!r}: expected driver=VERSION; before the groups, e.g. "
                "driver=570.158.01;4xGB200"
            )
    groups = tuple(_parse_group(part.strip(), n) for n, part in enumerate(text.split("+")))
    return _checked(MachineSpec(groups, driver))


_GROUP = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<product>[A-Za-z0-9-]+)(?::(?P<opts>.*))?$")


def _parse_group(text: str, n: int) -> GpuGroup:
    where = f"group {n + 1} ({text!r})"
    m = _GROUP.match(text)
    if not m:
        raise FakeSpecError(f"{where}: expected [COUNTx]PRODUCT[:key=value,...], e.g. 4xH100-80GB")
    count = int(m["count"]) if m["count"] else 1
    options: dict[str, str] = {}
    for opt in m["opts"].split(",") if m["opts"] is not None else []:
        key, eq, value = opt.strip().partition("=")
        if not eq or not key or not value:
            raise FakeSpecError(f"{where}: option {opt.strip()!r} is not key=value")
        if key in options:
            raise FakeSpecError(f"{where}: option {key!r} given twice")
        options[key] = value.strip()
    unknown = set(options) - {"nvlink", "mig", "cluster", "clique", "absent"}
    if unknown:
        raise FakeSpecError(
            f"{where}: unknown option {sorted(unknown)[0]!r}; "
            "known: nvlink, mig, cluster, clique, absent"
        )
    absent = options.get("absent")
    if absent is not None and not absent.isdigit():
        raise FakeSpecError(f"{where}: absent must be a slot number (0-based), not {absent!r}")
    clique = options.get("clique")
    if clique is not None and not clique.isdigit():
        raise FakeSpecError(f"{where}: clique must be a non-negative integer, not {clique!r}")
    mig = options.get("mig")
    if mig is not None and mig not in ("on", "off"):
        raise FakeSpecError(f"{where}: mig must be on or off, not {mig!r}")
    return _group(
        lambda _field: where,
        product_key=m["product"],
        count=count,
        nvlink=options.get("nvlink"),
        mig=mig == "on",
        cluster=options.get("cluster"),
        clique=int(clique) if clique is not None else None,
        mig_devices=(),
        absent=frozenset({int(absent)}) if absent is not None else frozenset(),
    )


def _group(
    at: Callable[[str], str],
    *,
    product_key: str,
    count: int,
    nvlink: str | None,
    mig: bool,
    cluster: str | None,
    clique: int | None,
    mig_devices: tuple[MigDeviceSpec, ...],
    absent: frozenset[int] = frozenset(),
) -> GpuGroup:
    p = product(product_key)
    if p is None:
        raise FakeSpecError(
            f"{at('product')}: unknown product {product_key!r}; known: {', '.join(PRODUCTS)}"
        )
    if not 1 <= count <= MAX_GPUS:
        raise FakeSpecError(f"{at('count')}: count must be 1..{MAX_GPUS}, not {count}")
    if nvlink is None:
        link = _default_link(p, count)
    else:
        try:
            link = NvLink(nvlink)
        except ValueError:
            raise FakeSpecError(
                f"{at('nvlink')}: nvlink must be none, pairs, quads, all or fabric, not {nvlink!r}"
            ) from None
    if link is not NvLink.NONE and not p.has_nvlink:
        raise FakeSpecError(f"{at('nvlink')}: {p.key} has no NVLink; use nvlink=none")
    if link.bridge_size and count % link.bridge_size:
        need = "an even GPU count" if link is NvLink.PAIRS else "a GPU count divisible by 4"
        raise FakeSpecError(f"{at('nvlink')}: nvlink={link.value} needs {need}, not {count}")
    if (cluster is not None or clique is not None) and link is not NvLink.FABRIC:
        field = "cluster" if cluster is not None else "clique"
        raise FakeSpecError(f"{at(field)}: cluster and clique need nvlink=fabric")
    if mig and not p.mig_capable:
        raise FakeSpecError(f"{at('mig')}: {p.key} does not support MIG; use mig=off")
    outside = sorted(s for s in absent if not 0 <= s < count)
    if outside:
        raise FakeSpecError(f"{at('absent')}: slot {outside[0]} is not in 0..{count - 1}")
    if len(absent) == count:
        raise FakeSpecError(f"{at('absent')}: every GPU of the group is absent; drop the group")
    return GpuGroup(p, count, link, mig, cluster, clique, mig_devices, absent)


def _checked(spec: MachineSpec) -> MachineSpec:
    if spec.slot_count > MAX_GPUS:
        raise FakeSpecError(f"{spec.slot_count} GPUs in all; a fake machine holds {MAX_GPUS}")
    return spec


def parse_yaml_file(path: Path) -> MachineSpec:
    # Imported here: only @file specs need it, and the plugin in a pod (in-cluster
    # config, no kubeconfig to parse) would otherwise load it, 20-30 ms, on its way to
    # the first slice.
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise FakeSpecError(f"@{path}: cannot read the fleet file: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FakeSpecError(f"@{path}: not valid YAML: {exc}") from None
    try:
        return parse_fleet(doc)
    except FakeSpecError as exc:
        raise FakeSpecError(f"@{path}: {exc}") from None


def parse_fleet(doc: object) -> MachineSpec:
    """A fleet document already loaded from YAML (see the module docstring)."""
    top = _mapping(doc, "the document", {"gpus", "driverVersion", "cudaDriverVersion"})
    if "gpus" not in top:
        raise FakeSpecError("gpus: required, a list of GPU groups")
    gpus = top["gpus"]
    if not isinstance(gpus, list) or not gpus:
        raise FakeSpecError("gpus: must be a non-empty list of GPU groups")
    driver = top.get("driverVersion")
    if driver is not None and not (
        isinstance(driver, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", driver)
    ):
        raise FakeSpecError(f'driverVersion: expected a string like "570.86.15", not {driver!r}')
    cuda = top.get("cudaDriverVersion")
    if cuda is not None and not (_is_int(cuda) and cuda > 0):
        raise FakeSpecError(f"cudaDriverVersion: expected an integer like 12080, not {cuda!r}")
    groups = tuple(_fleet_group(g, f"gpus[{n}]") for n, g in enumerate(gpus))
    return _checked(MachineSpec(groups, driver, cuda))


_GROUP_KEYS = {"product", "count", "nvlink", "mig", "cluster", "clique", "absent", "migDevices"}


def _fleet_group(raw: object, where: str) -> GpuGroup:
    g = _mapping(raw, where, _GROUP_KEYS)
    key = g.get("product")
    if not isinstance(key, str):
        raise FakeSpecError(f"{where}.product: required, a product name such as H100-80GB")
    count = g.get("count", 1)
    if not _is_int(count):
        raise FakeSpecError(f"{where}.count: expected an integer, not {count!r}")
    nvlink = g.get("nvlink")
    if nvlink is not None and not isinstance(nvlink, str):
        raise FakeSpecError(f"{where}.nvlink: expected none, pairs, quads, all or fabric")
    mig = _on_off(g.get("mig", False), f"{where}.mig")
    cluster = g.get("cluster")
    if cluster is not None and not isinstance(cluster, str | int):
        raise FakeSpecError(f"{where}.cluster: expected a name")
    clique = g.get("clique")
    if clique is not None and not (_is_int(clique) and clique >= 0):
        raise FakeSpecError(f"{where}.clique: expected a non-negative integer, not {clique!r}")
    raw_absent = g.get("absent", [])
    if _is_int(raw_absent):
        raw_absent = [raw_absent]
    if not (isinstance(raw_absent, list) and all(_is_int(a) for a in raw_absent)):
        raise FakeSpecError(f"{where}.absent: expected a list of slot numbers, not {raw_absent!r}")
    raw_devices = g.get("migDevices", [])
    if not isinstance(raw_devices, list):
        raise FakeSpecError(f"{where}.migDevices: expected a list")
    devices = tuple(_mig_device(d, f"{where}.migDevices[{i}]") for i, d in enumerate(raw_devices))
    group = _group(
        lambda field: f"{where}.{field}",
        product_key=key,
        count=count,
        nvlink=nvlink,
        mig=mig,
        cluster=str(cluster) if cluster is not None else None,
        clique=clique,
        mig_devices=devices,
        absent=frozenset(raw_absent),
    )
    _check_mig_devices(group, where)
    return group


def _mig_device(raw: object, where: str) -> MigDeviceSpec:
    d = _mapping(raw, where, {"gpu", "profile", "placement", "computeInstances"})
    for field in ("gpu", "profile", "placement"):
        if field not in d:
            raise FakeSpecError(f"{where}.{field}: required")
    if not (_is_int(d["gpu"]) and d["gpu"] >= 0):
        raise FakeSpecError(f"{where}.gpu: expected a GPU index within the group")
    if not isinstance(d["profile"], str):
        raise FakeSpecError(f"{where}.profile: expected a profile name such as 3g.40gb")
    if not (_is_int(d["placement"]) and d["placement"] >= 0):
        raise FakeSpecError(f"{where}.placement: expected a memory-slice start such as 0 or 4")
    cis = d.get("computeInstances")
    if cis is not None and not (
        isinstance(cis, list) and all(_is_int(c) and c in (1, 2, 3, 4, 7) for c in cis)
    ):
        raise FakeSpecError(
            f"{where}.computeInstances: expected a list of compute-instance sizes "
            "(1, 2, 3, 4 or 7 slices)"
        )
    return MigDeviceSpec(
        d["gpu"], d["profile"], d["placement"], tuple(cis) if cis is not None else None
    )


def _check_mig_devices(group: GpuGroup, where: str) -> None:
    if group.mig_devices and not group.mig:
        raise FakeSpecError(f"{where}.migDevices: needs mig: on")
    layouts: dict[int, list[mig_rules.Placed]] = {}
    for i, d in enumerate(group.mig_devices):
        at = f"{where}.migDevices[{i}]"
        if d.gpu >= group.count:
            raise FakeSpecError(f"{at}.gpu: {d.gpu} is not in 0..{group.count - 1}")
        if d.gpu in group.absent:
            raise FakeSpecError(f"{at}.gpu: slot {d.gpu} is absent")
        profile = group.product.gi_profile_by_name(d.profile)
        if profile is None:
            names = ", ".join(p.name for p in group.product.gi_profiles)
            raise FakeSpecError(
                f"{at}.profile: {d.profile!r} is not a {group.product.key} profile; known: {names}"
            )
        if d.placement not in profile.placement_starts:
            raise FakeSpecError(
                f"{at}.placement: {profile.name} can start at "
                f"{', '.join(map(str, profile.placement_starts))}, not {d.placement}"
            )
        if d.compute_instances is not None and sum(d.compute_instances) > profile.compute_slices:
            raise FakeSpecError(
                f"{at}.computeInstances: {sum(d.compute_instances)} slices do not fit the "
                f"{profile.compute_slices} compute slices of {profile.name}"
            )
        layout = layouts.setdefault(d.gpu, [])
        why = mig_rules.violation_adding(layout, (profile, d.placement))
        if why is not None:
            raise FakeSpecError(f"{at}: does not fit beside the GPU's earlier devices: {why.value}")
        layout.append((profile, d.placement))


def _mapping(raw: object, where: str, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise FakeSpecError(f"{where}: expected a mapping")
    for key in raw:
        if key not in known:
            raise FakeSpecError(
                f"{where}: unknown field {key!r}; known: {', '.join(sorted(known))}"
            )
    return raw


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _on_off(v: object, where: str) -> bool:
    # YAML 1.1 reads a bare on/off as a boolean already.
    if isinstance(v, bool):
        return v
    if v in ("on", "off"):
        return v == "on"
    raise FakeSpecError(f"{where}: expected on or off, not {v!r}")
