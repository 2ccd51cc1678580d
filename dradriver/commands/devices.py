"""`dradriver devices`: the inventory and the ResourceSlices this node would publish,
offline. A newcomer's first look, and a debugging tool on a real node."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver import flags

# Loaded when the command runs: building the CLI's parser (every `dradriver` start, the
# kubelet plugin's included) must not import NVML, the slice builder or YAML.
if TYPE_CHECKING:
    from dradriver.health.model import HealthBook
    from dradriver.inventory.model import Gpu, Inventory
    from dradriver.nvml.library import Nvml
    from dradriver.slices.build import BuildResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_node_flags(p)
    p.add_argument(
        "--kubernetes",
        default="1.34",
        metavar="LINE",
        help="the Kubernetes line of the API server the slices are laid out for, 1.34 to "
        "1.37: from 1.35 counter sets go in slices of their own and a slice holds at most "
        "64 devices (the plugin asks its API server; default: %(default)s)",
    )
    p.add_argument(
        "-o",
        "--output",
        default="table",
        choices=["table", "json", "yaml"],
        help="table for people (sizes in binary units, GiB); json or yaml for programs, "
        "with exact byte counts and camelCase keys as in Kubernetes objects "
        "(default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from dradriver.inventory.node_devices import MigSwitching
    from dradriver.k8s.lines import LineError, line
    from dradriver.nvml.explain import NvmlUnavailable
    from dradriver.nvml.library import DevicesSpecError, open_nvml
    from dradriver.slices.build import MigMode, build
    from dradriver.slices.publish import render

    try:
        k8s = line(args.kubernetes)
    except LineError as exc:
        print(f"dradriver devices: --kubernetes: {exc}", file=sys.stderr)
        return 2
    try:
        nvml = open_nvml(
            args.devices,
            node=args.node_name,
            state_dir=Path(args.state_dir)
            if args.devices != "nvml" and Path(args.state_dir).is_dir()
            else None,
        )
        found = nvml.discover()
    except (NvmlUnavailable, DevicesSpecError) as exc:
        print(f"dradriver devices: {exc}", file=sys.stderr)
        return 1
    from dradriver.slices.consumable import ConsumableModeError
    from dradriver.slices.consumable import from_flags as consumable_from_flags

    try:
        consumable = consumable_from_flags(args.consumable_capacity, args.mig_mode)
    except ConsumableModeError as exc:
        print(f"dradriver devices: {exc}", file=sys.stderr)
        return 2
    result = build(
        found.inventory,
        MigMode(args.mig_mode),
        switching=MigSwitching(args.mig_mode_switching),
        profiles=flags.mig_profiles(args.mig_profiles),
        consumable=consumable,
        line=k8s,
    )
    book = health_now(nvml, found.inventory, Path(args.state_dir))
    from dradriver.health.model import device_health, unhealthy
    from dradriver.slices.taints import TaintEffect, with_taints

    # As the plugin would publish them: unhealthy devices tainted (its default effect).
    faults = unhealthy(device_health(book, result.offer.devices().values()))
    tainted = with_taints(result.slices, faults, args.driver_name, effect=TaintEffect.NO_SCHEDULE)
    slices = render(args.driver_name, args.node_name, tainted)
    if args.output == "table":
        print(table(args, found.inventory, result, problems=found.problems, book=book))
        return 0
    doc = {
        "node": args.node_name,
        "driver": args.driver_name,
        "migMode": args.mig_mode,
        "kubernetes": k8s.name,
        "inventory": camel_keys(found.inventory.to_json()),
        "health": {
            g.uuid: {
                "health": str(book.get(g.uuid).health),
                "reason": _reason(book, g.uuid),
            }
            for g in found.inventory.gpus
        },
        "problems": found.problems,
        "skipped": [
            {"uuid": k.uuid, "reason": k.reason, "message": k.message} for k in result.skipped
        ],
        "resourceSlices": slices,
    }
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def health_now(nvml: Nvml, inv: Inventory, state_dir: Path) -> HealthBook:
    """What the plugin decided (its <state dir>/health.json, where it exists: a fault it
    saw stays until it has probed the GPU clean) and what a probe finds now."""
    import time

    from dradriver.health.model import HealthBook
    from dradriver.health.monitor import probe_gpu
    from dradriver.health.store import FILE_NAME, HealthStore
    from dradriver.nvml.discover import nvml_session

    saved = HealthStore(state_dir / FILE_NAME).load() if state_dir.is_dir() else None
    book = HealthBook(gpus=dict(saved.gpus) if saved else {})
    with nvml_session(nvml.module):
        for g in inv.gpus:
            book.observe(probe_gpu(nvml.module, g.uuid), int(time.time()))
    return book


def _reason(book: HealthBook, uuid: str) -> str:
    g = book.get(uuid)
    if g.fault is not None:
        return g.fault.reason
    if g.instances:
        return ",".join(sorted({f"gi-{f.reason}" for _, f in g.instances}))
    return g.unknown


def camel_keys(value: Any) -> Any:
    """The inventory's dataclass fields (snake_case) as camelCase keys, so the whole
    document reads like the Kubernetes objects beside it. Only keys change: the inventory
    holds no maps keyed by data, so no value is ever renamed."""
    if isinstance(value, dict):
        return {_camel(k): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [camel_keys(v) for v in value]
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int) -> str:
    """A byte count as people read one: the largest binary unit that keeps the number at
    1 or more, one decimal, none when it is whole ("80 GiB", "79.6 GiB", "512 B")."""
    value, unit = float(n), 0
    # Compared after rounding, so 1023.97 MiB reads "1 GiB", not "1024 MiB".
    while round(abs(value), 1) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return f"{text} {_UNITS[unit]}"


def _mig(g: Gpu) -> str:
    if not g.mig_capable:
        return "-"
    state = "on" if g.mig_enabled else "off"
    devs = f", {len(g.mig_devices)} devices" if g.mig_devices else ""
    return f"{state}{devs}"


def _placements(starts: tuple[int, ...]) -> str:
    return ",".join(str(x) for x in starts) or "-"


def _profiles(inv: Inventory) -> list[str]:
    """The MIG profiles of each kind of GPU (once per product), as a claim's CEL names them
    (`device.attributes["<domain>"].profile`), with what each instance gets."""
    out: list[str] = []
    seen: set[str] = set()
    for g in inv.gpus:
        if not g.mig_profiles or g.product_name in seen:
            continue
        seen.add(g.product_name)
        rows: list[list[Any]] = [
            ["PROFILE", "MEMORY", "SMS", "NVDEC", "NVENC", "JPEG", "OFA", "PLACEMENTS", "MAX"]
        ]
        for p in g.mig_profiles:
            rows.append(
                [
                    p.name,
                    human_bytes(p.memory_bytes),
                    p.multiprocessors,
                    p.decoders,
                    p.encoders,
                    p.jpeg_engines,
                    p.ofa_engines,
                    _placements(p.placements),
                    p.instance_count,
                ]
            )
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
        out += ["", f"MIG profiles of {g.product_name} (GPU {g.index} and alike):"]
        out += [
            "  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
    return out


def table(
    args: argparse.Namespace,
    inv: Inventory,
    result: BuildResult,
    *,
    problems: list[str],
    book: HealthBook | None = None,
) -> str:
    from dradriver.health.model import HealthBook
    from dradriver.inventory.node_devices import gpu_device_name

    book = book or HealthBook()
    rows: list[list[Any]] = [
        ["IDX", "NAME", "PRODUCT", "MEMORY", "CC", "NUMA", "NVLINK", "MIG", "HEALTH", "UUID"]
    ]
    for g in inv.gpus:
        health = book.get(g.uuid).health
        why = _reason(book, g.uuid)
        rows.append(
            [
                g.index,
                gpu_device_name(g),
                g.product_name,
                human_bytes(g.memory_bytes),
                g.cuda_compute_capability,
                "-" if g.numa_node is None else g.numa_node,
                g.nvlink_domain or "-",
                _mig(g),
                f"{health.lower()}:{why}" if why else health.lower(),
                g.uuid,
            ]
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = [
        f"node {args.node_name}: {_n(len(inv.gpus), 'GPU')}, driver {inv.driver_version}, "
        f"CUDA {inv.cuda_driver_version}",
        "",
    ]
    out += [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    out += _profiles(inv)
    devices = sum(len(s.devices) for s in result.slices)
    out += [
        "",
        f"ResourceSlices ({args.mig_mode} MIG mode, driver {args.driver_name}, laid out for "
        f"Kubernetes {args.kubernetes}): {_n(len(result.slices), 'slice')}, "
        f"{_n(devices, 'device')}",
    ]
    for s in result.slices:
        kinds: dict[str, int] = {}
        for d in s.devices:
            t = d["attributes"]["type"]["string"]
            kinds[t] = kinds.get(t, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        counters = sum(len(c["counters"]) for c in s.shared_counters)
        if not s.devices:  # from 1.35: a slice of counter sets only
            sets = _n(len(s.shared_counters), "counter set")
            out.append(f"  {s.key}: {sets}, {_n(counters, 'shared counter')}")
            continue
        extra = f", {_n(counters, 'shared counter')}" if counters else ""
        out.append(f"  {s.key}: {_n(len(s.devices), 'device')} ({what}){extra}")
    for uuid, reason in ((k.uuid, k.message) for k in result.skipped):
        out.append(f"  note: {uuid}: {reason}")
    for p in problems:
        out.append(f"  problem: {p}")
    known = {g.uuid for g in inv.gpus}
    for uuid, h in sorted(book.gpus.items()):
        if uuid not in known and h.faulty:
            out.append(f"  unhealthy: {uuid}: {_reason(book, uuid)} (NVML cannot describe it)")
    out += _shares(result, Path(args.state_dir), getattr(args, "consumable_capacity", "off"))
    return "\n".join(out)


def _shares(result: BuildResult, state_dir: Path, mode: str) -> list[str]:
    """Each device several claims may share (--consumable-capacity), with what the shares
    this node's plugin prepared hold of it (its checkpoint in --state-dir, read only)."""
    from fractions import Fraction

    from dradriver.api.quantity import human, parse
    from dradriver.diagnose.capacity import capacities
    from dradriver.kubeletplugin.state.checkpoint.codec import parse_checkpoint
    from dradriver.kubeletplugin.state.files import CheckpointCorrupt

    shared = [d for s in result.slices for d in s.devices if d.get("allowMultipleAllocations")]
    if not shared:
        return []
    held: dict[str, dict[str, Fraction]] = {}
    claims: dict[str, int] = {}
    note = ""
    path = state_dir / "checkpoint.json"
    try:
        cp, _ = parse_checkpoint(path.read_bytes())
        for rec in cp.claims.values():
            for pd in rec.devices:
                if pd.share is None:
                    continue
                claims[pd.device] = claims.get(pd.device, 0) + 1
                sums = held.setdefault(pd.device, {})
                for name, amount in pd.share.consumed:
                    sums[name] = sums.get(name, Fraction(0)) + parse(amount)
    except FileNotFoundError:
        note = f" (no checkpoint at {path}: no shares prepared)"
    except (OSError, CheckpointCorrupt, ValueError) as exc:
        note = f" (checkpoint {path} unreadable: {exc})"
    out = ["", f"Shared devices (--consumable-capacity {mode}){note}:"]
    for d in shared:
        caps = capacities(d)
        mine = held.get(d["name"], {})
        parts = []
        for name, c in sorted(caps.items()):
            binary = name == "memory"
            used = mine.get(name, Fraction(0))
            parts.append(
                f"{name} {human(used, binary)} of {human(c.value, binary)} "
                f"({human(c.value - used, binary)} free)"
            )
        out.append(f"  {d['name']}: {claims.get(d['name'], 0)} shares; " + ", ".join(parts))
    return out


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
