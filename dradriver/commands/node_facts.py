"""`dradriver doctor`'s layers that only the node can check: NVML, the CDI directory and
the runtime's CDI setting, the driver's CDI spec. Each gathers its facts from this host
and hands them to diagnose.doctor's judgement.

Their own file because they read the local machine (the devices, the filesystem), where
doctor.py's other layers ask the plugin and the API server, and they are skipped
together when doctor runs away from the node.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dradriver.diagnose.doctor import Layer

# What the cdi layer says of a dev node's runtime: the hollow node's CRI resolves CDI
# devices from the directory its plugin writes to, and no containerd is involved.
HOLLOW_RUNTIME = "the hollow node's runtime resolves CDI devices from it"


def nvml(args: argparse.Namespace) -> tuple[Layer, set[str] | None, str]:
    """The nvml layer, the GPUs' UUIDs and the driver's version as NVML says it."""
    from dradriver.diagnose import doctor as judge

    if not args.devices:
        return judge.nvml(None, None, ""), None, ""
    from dradriver.nvml.library import open_nvml

    try:
        # Only a state directory the plugin made: doctor must not create one.
        state = Path(args.state_dir) if Path(args.state_dir).is_dir() else None
        backend = open_nvml(args.devices, node=args.node, state_dir=state)
        found = backend.discover()
    except Exception as exc:  # NVML raises its own error classes, one per return code
        return judge.nvml(args.devices, None, f"{type(exc).__name__}: {exc}"), None, ""
    inv = found.inventory
    layer = judge.nvml(
        args.devices, (inv.driver_version, inv.cuda_driver_version, len(inv.gpus)), ""
    )
    return layer, {g.uuid for g in inv.gpus}, inv.driver_release


def driver_files(args: argparse.Namespace, release: str) -> Layer:
    import json

    from dradriver.diagnose import doctor as judge
    from dradriver.diagnose.doctor import Layer, State

    if not args.devices:
        return Layer("driver-files", State.SKIP, "not on the node")
    path = Path(args.cdi_dir) / f"{args.driver_name}-driver.json"
    spec = None
    with contextlib.suppress(OSError, ValueError):
        spec = json.loads(path.read_text())
    return judge.driver_files(args.driver_files, release, str(path), spec=spec)


def cdi(args: argparse.Namespace) -> Layer:
    from dradriver.diagnose import doctor as judge
    from dradriver.diagnose.doctor import Layer, State

    if not args.devices:
        return Layer("cdi", State.SKIP, "not on the node (pass --devices to check it here)")
    error: str | None = None
    d = Path(args.cdi_dir)
    if not d.is_dir():
        error = "it does not exist"
    else:
        import tempfile

        try:
            with tempfile.NamedTemporaryFile(dir=d, prefix=".dradriver-doctor-"):
                pass
        except OSError as exc:
            error = exc.strerror or str(exc)
    if args.containerd_config is None:  # a dev node
        return judge.cdi(str(d), error, None, runtime_reads=HOLLOW_RUNTIME)
    runtime = None
    conf = Path(args.containerd_config)
    with contextlib.suppress(OSError):  # not on this machine, or not ours to read
        runtime = (str(conf), conf.read_text())
    return judge.cdi(str(d), error, runtime)
