"""`make gpu-check`: dradriver against a real GPU, strictly read-only (NVML queries,
`nvidia-ctk cdi generate` to stdout, `nvidia-smi -L`; never a MIG mode, clock or any other
setting). Three comparisons, each printed and written to --out as Markdown and JSON:

1. discovery: each GPU as `dradriver devices --devices nvml` reads it, beside the fake
   product of the same name (fakenvml/products.py), attribute by attribute (memory,
   compute capability, MIG profiles and placements, NVLink, PCI, NUMA); identities (UUID,
   bus ID, names) are shown, not compared;
2. the driver's files: what the plugin's driver spec would carry (tools/nvcdi's
   dradriver-nvcdi) beside `nvidia-ctk cdi generate` of the same toolkit release on that
   host: container paths of mounts, hooks, device nodes;
3. nvidia-smi run as a container would get it from that spec: the spec's nvidia-smi with
   the spec's library directories.

Without a GPU it runs over a fake (`--devices fake:1xH200-141GB --driver-root DIR`), which
is how the tests keep it working for the task that has one. The device machine has no
network and no Go: tools/gpu-check/run.sh bundles what this needs (pynvml, PyYAML, the
toolkit binaries) into build/gpu-check/ here, which the device run carries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# What names a GPU rather than describes it: shown side by side, never a difference.
IDENTITY = {"index", "uuid", "minor", "name", "pciBusId", "pcieRoot", "nvlinkDomain"}
# What the fake draws from the spec or the node rather than from the product.
STATE = {"migEnabled", "migDevices", "idleGpuInstances"}


@dataclass(frozen=True)
class Difference:
    gpu: str  # the real GPU's name
    path: str  # "migProfiles[1g.18gb].placements"
    real: Any
    fake: Any


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b[key]": leaf}; list items keyed by their name or profile name where they have
    one, so that a profile missing on one side is one difference, not a shifted list."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            key = v.get("name", v.get("profileId", i))
            out.update(_flat(v, f"{prefix}[{key}]"))
        return out
    return {prefix: value}


def compare_gpu(real: dict[str, Any], fake: dict[str, Any]) -> list[Difference]:
    """Every attribute of `real` (one GPU of `dradriver devices -o json`) that its fake
    twin describes otherwise, or lacks, or has where the real one does not."""
    skip = IDENTITY | STATE
    a = _flat({k: v for k, v in real.items() if k not in skip})
    b = _flat({k: v for k, v in fake.items() if k not in skip})
    return [
        Difference(str(real.get("name", "?")), path, a.get(path), b.get(path))
        for path in sorted(set(a) | set(b))
        if a.get(path) != b.get(path)
    ]


def compare_edits(ours: dict[str, Any], toolkit: dict[str, Any]) -> dict[str, list[str]]:
    """Container paths (mounts, device nodes) and hooks one side has and the other not.
    `ours`: dradriver-nvcdi's containerEdits; `toolkit`: nvidia-ctk's whole spec."""
    theirs: dict[str, list[Any]] = {"mounts": [], "deviceNodes": [], "hooks": []}
    for edits in [toolkit.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in toolkit.get("devices") or []
    ]:
        for key in theirs:
            theirs[key] += edits.get(key) or []

    def paths(edits: dict[str, Any]) -> dict[str, set[str]]:
        return {
            "mounts": {m["containerPath"] for m in edits.get("mounts") or []},
            "deviceNodes": {d["path"] for d in edits.get("deviceNodes") or []},
            "hooks": {" ".join(h.get("args", [])[1:2]) for h in edits.get("hooks") or []},
        }

    mine, other = paths(ours), paths(theirs)
    out: dict[str, list[str]] = {}
    for key in mine:
        out[f"{key} only in dradriver"] = sorted(mine[key] - other[key])
        out[f"{key} only in nvidia-ctk"] = sorted(other[key] - mine[key])
    return out


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def devices_json(devices: str) -> dict[str, Any]:
    code, out, err = _run(
        [sys.executable, "-m", "dradriver.cli", "devices", "--devices", devices, "-o", "json"]
    )
    if code != 0:
        raise SystemExit(f"gpu-check: `dradriver devices --devices {devices}` failed: {err}")
    doc: dict[str, Any] = json.loads(out)
    return doc


def fake_twin(real_gpus: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The fake of each real product, as many as the node has, by real GPU name."""
    from fakenvml.products import PRODUCTS

    by_name = {p.name: p.key for p in PRODUCTS.values()}
    counts: dict[str, int] = {}
    for g in real_gpus:
        counts[g["productName"]] = counts.get(g["productName"], 0) + 1
    twins: dict[str, dict[str, Any]] = {}
    for product, n in counts.items():
        key = by_name.get(product)
        if key is None:
            continue
        fakes = devices_json(f"fake:{n}x{key}")["inventory"]["gpus"]
        reals = [g for g in real_gpus if g["productName"] == product]
        for r, f in zip(reals, fakes, strict=True):
            twins[r["name"]] = f
    return twins


def driver_files(tools: Path, root: str, release: str) -> tuple[dict[str, Any], str]:
    code, out, err = _run(
        [str(tools / "dradriver-nvcdi"), f"--driver-root={root}", f"--driver-version={release}"]
    )
    return (json.loads(out) if code == 0 else {}), err.strip()


def toolkit_spec(tools: Path, root: str) -> tuple[dict[str, Any], str]:
    ctk = tools / "nvidia-ctk"
    if not ctk.exists():
        return {}, "nvidia-ctk not bundled"
    code, out, err = _run(
        [str(ctk), "cdi", "generate", "--format=json", f"--driver-root={root}", "--mode=nvml"]
    )
    return (json.loads(out) if code == 0 else {}), err.strip()[-500:]


def smi_through(edits: dict[str, Any]) -> tuple[int, str]:
    """nvidia-smi -L as a container given these edits runs it: the spec's binary, the
    spec's library directories first."""
    mounts = {m["containerPath"]: m["hostPath"] for m in edits.get("mounts") or []}
    smi = next((h for c, h in mounts.items() if c.endswith("/nvidia-smi")), None)
    if smi is None:
        return 127, "no nvidia-smi in the spec"
    libs = sorted({str(Path(h).parent) for c, h in mounts.items() if ".so" in c})
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(libs)}
    code, out, err = _run([smi, "-L"], env)
    return code, (out or err).strip()


def report(args: argparse.Namespace) -> dict[str, Any]:
    real = devices_json(args.devices)
    inv = real["inventory"]
    twins = fake_twin(inv["gpus"])
    diffs = [d for g in inv["gpus"] if g["name"] in twins for d in compare_gpu(g, twins[g["name"]])]
    ours, ours_err = driver_files(args.tools, args.driver_root, inv.get("driverRelease", ""))
    ctk, ctk_err = toolkit_spec(args.tools, args.driver_root)
    smi = smi_through(ours)
    return {
        "driver": inv.get("driverRelease"),
        "gpus": [
            {k: g.get(k) for k in ("name", "productName", "uuid", "pciBusId", "numaNode")}
            for g in inv["gpus"]
        ],
        "noFake": sorted({g["productName"] for g in inv["gpus"] if g["name"] not in twins}),
        "discoveryDifferences": [asdict(d) for d in diffs],
        "driverFiles": {
            "mounts": len(ours.get("mounts") or []),
            "hooks": len(ours.get("hooks") or []),
            "error": ours_err if not ours else "",
        },
        "toolkit": compare_edits(ours, ctk) if ctk else {"error": ctk_err},
        "nvidiaSmi": {"exit": smi[0], "output": smi[1]},
    }


def markdown(r: dict[str, Any]) -> str:
    out = [f"# gpu-check: driver {r['driver']}", ""]
    for g in r["gpus"]:
        out.append(f"- {g['name']}: {g['productName']} {g['uuid']} at {g['pciBusId']}")
    if r["noFake"]:
        out.append(f"- no fake product for: {', '.join(r['noFake'])}")
    out += ["", "## Discovery: real vs fake", ""]
    diffs = r["discoveryDifferences"]
    if diffs:
        out += ["| GPU | attribute | real | fake |", "|---|---|---|---|"]
        out += [f"| {d['gpu']} | {d['path']} | {d['real']} | {d['fake']} |" for d in diffs]
    else:
        out.append("no difference")
    out += ["", "## The driver's files: dradriver-nvcdi vs nvidia-ctk cdi generate", ""]
    out.append(f"dradriver: {r['driverFiles']}")
    for key, paths in r["toolkit"].items():
        out.append(f"- {key}: {paths if paths else 'none'}")
    out += ["", "## nvidia-smi -L through the spec", "", f"exit {r['nvidiaSmi']['exit']}:"]
    out.append(r["nvidiaSmi"]["output"])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dradriver_dev.gpu_check", description=__doc__)
    p.add_argument("--devices", default="nvml", help="nvml, or fake:<spec> to try it out")
    p.add_argument("--driver-root", default="/", help="where the driver's files are")
    p.add_argument("--tools", type=Path, required=True, help="dradriver-nvcdi, nvidia-ctk")
    p.add_argument("--out", type=Path, help="where gpu-check.md and gpu-check.json go")
    args = p.parse_args(argv)
    r = report(args)
    text = markdown(r)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-check.md").write_text(text)
        (args.out / "gpu-check.json").write_text(json.dumps(r, indent=2, default=str))
    if shutil.which("nvidia-smi") is None and args.devices == "nvml":
        print("gpu-check: note: no nvidia-smi on this host's PATH", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
