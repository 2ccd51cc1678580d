"""What the plugin removes from its state directory when the driver leaves the node, and
when it may: plan_tidy() is pure (the directory's entries and what the state says in, a
plan or the reason to keep everything out), apply_tidy() removes what the plan names.

Only when the driver is uninstalled (uninstall.py decides that from the DaemonSet), never
at a restart: the checkpoint, the ledger and the name book are what keep a device from
being handed out twice after a crash and explain a GPU gone after a reboot. And only when
nothing is left to undo: no claim prepared, no MIG mode or instance and no compute mode,
time slice or MPS daemon the driver changed and has not put back, no other instance on
the node. Only the names the plugin (and the fake NVML it ships) write are removed; a
state directory shared by mistake keeps everything else, and so do files an unreadable
checkpoint or ledger was moved aside to (evidence for the admin).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

# The files the plugin writes at the top of its state directory.
OWNED_FILE = re.compile(
    r"(checkpoint\.json|device-names\.json|ledger\.json(\.lock)?|health\.json|plugin\.lock"
    # The fake NVML's machine (fake GPUs' MIG and health state), its fault requests, and
    # the fake host's compute modes and intervals.
    r"|fake-nvml-[^/]+\.(json|requests)|fake-sharing-[^/]+\.json(\.lock)?)"
)
# Directories it writes, and what they may hold for the tidy to empty them.
OWNED_DIRS = {
    "locks": re.compile(r"GPU-[0-9a-fA-F-]+\.lock|MIG-[0-9a-fA-F-]+\.lock|[^/]+\.lock"),
    # MPS pipe and log directories, IMEX daemons' config directories: empty once every
    # daemon is gone.
    "mps": None,
    "imex": None,
}


@dataclass(frozen=True)
class Leftovers:
    """What the state says is still there; anything in it keeps the directory as is."""

    claims: tuple[str, ...] = ()  # prepared claims in the checkpoint
    mig_changes: tuple[str, ...] = ()  # GPUs / instances the ledger holds
    sharing_claims: tuple[str, ...] = ()  # claims the ledger holds sharing changes for
    imex_claims: tuple[str, ...] = ()  # claims the ledger holds an IMEX daemon for
    other_instances: tuple[str, ...] = ()  # other registration sockets of this driver


@dataclass(frozen=True)
class TidyPlan:
    files: tuple[str, ...]  # relative paths to unlink
    dirs: tuple[str, ...]  # relative directories to remove once empty, deepest first
    kept: tuple[str, ...]  # entries not ours, left alone


def keep_reason(left: Leftovers) -> str:
    """Why nothing may be removed ("" when the tidy may go ahead)."""
    if left.other_instances:
        return f"another instance of the driver is registered: {', '.join(left.other_instances)}"
    if left.claims:
        return f"{len(left.claims)} claims are still prepared here: {', '.join(left.claims[:5])}"
    if left.mig_changes:
        return f"MIG changes not yet undone: {', '.join(left.mig_changes[:5])}"
    if left.sharing_claims:
        return f"sharing changes not yet undone for {', '.join(left.sharing_claims[:5])}"
    if left.imex_claims:
        return f"IMEX daemons not yet stopped for {', '.join(left.imex_claims[:5])}"
    return ""


def plan_tidy(entries: list[tuple[str, bool]]) -> TidyPlan:
    """`entries`: (path relative to the state directory, is a directory), every level."""
    files: list[str] = []
    dirs: list[str] = []
    kept: list[str] = []
    for rel, is_dir in sorted(entries):
        top, _, rest = rel.partition("/")
        if rest and top not in OWNED_DIRS:
            continue  # inside something kept: already reported
        # At the top, the plugin's own files; inside its directories, what each may hold.
        pattern = OWNED_DIRS[top] if rest else OWNED_FILE
        if is_dir and top in OWNED_DIRS:
            dirs.append(rel)
        elif not is_dir and pattern is not None and pattern.fullmatch(rest or top):
            files.append(rel)
        else:
            kept.append(rel)
    # Deepest first, so that each directory is empty when its turn comes.
    dirs.sort(key=lambda d: d.count("/"), reverse=True)
    return TidyPlan(tuple(files), tuple(dirs), tuple(kept))


def entries_of(state_dir: Path) -> list[tuple[str, bool]]:
    return [
        (str(p.relative_to(state_dir)), p.is_dir() and not p.is_symlink())
        for p in state_dir.rglob("*")
    ]


def apply_tidy(state_dir: Path, plan: TidyPlan) -> list[str]:
    """Removes what the plan names; returns what could not be (a directory with a file
    someone else put there meanwhile stays, as does the state directory itself, which
    is the pod's mount point)."""
    failed = []
    for rel in (*plan.files, *plan.dirs):  # the files first: each directory empty in turn
        try:
            if rel in plan.dirs:
                (state_dir / rel).rmdir()
            else:
                (state_dir / rel).unlink()
        except FileNotFoundError:
            pass
        except OSError:
            failed.append(rel)
    with contextlib.suppress(OSError):
        state_dir.rmdir()  # empty and not a mount point: a plugin run outside a pod
    return failed
