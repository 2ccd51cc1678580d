"""dradriver/'s packages form a DAG, checked rather than hoped for: each top-level package
or module imports only those below it in LAYERS (the order a reader learns them in: the
basics, the pure core, the edges to NVML and Kubernetes, what is built on them, the
components, the commands). kubeletplugin/'s own packages have their rules in
tests/unit/kubeletplugin/test_layout.py."""

from __future__ import annotations

from pathlib import Path

from tests.support.pyimports import module_imports

ROOT = Path(__file__).resolve().parents[2] / "dradriver"
# Lowest first. A unit may import any unit before it, none after it.
LAYERS = (
    "errors",  # the typed errors, one per layer
    "logs",
    "crashpoints",
    "httpreply",
    "flags",  # the flags both components and the commands take
    "api",  # wire and config contracts, quantities and units
    "inventory",  # pure: the GPU model, names, the node's devices
    "k8s",  # the Kubernetes API edge and what each line gives
    "nvml",  # the only code touching NVML
    "health",  # pure GPU health and its NVML monitor
    "slices",  # devices -> ResourceSlices, their taints, publishing
    "diagnose",  # pure judgement for explain, doctor and fleet
    "kubeletplugin",
    "controller",
    "commands",
    "cli",
)


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return rel.parts[0]


def test_every_unit_has_a_place() -> None:
    units = {unit_of(p) for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT}
    assert units <= set(LAYERS), sorted(units - set(LAYERS))


def test_nothing_imports_upward() -> None:
    rank = {u: i for i, u in enumerate(LAYERS)}
    upward = []
    for path in ROOT.rglob("*.py"):
        if "gen" in path.relative_to(ROOT).parts or (
            path.parent == ROOT and path.name == "__init__.py"
        ):
            continue
        me = unit_of(path)
        for module in module_imports(path):
            parts = module.split(".")
            if parts[0] != "dradriver" or len(parts) < 2 or parts[1] == me:
                continue
            if rank[parts[1]] > rank[me]:
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert upward == []
