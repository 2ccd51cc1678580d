"""`dradriver kubelet-plugin` from the process's first instant: the kubelet's two sockets
are up before anything heavy is imported (NVML, the API client, the config models), so
the kubelet finds the plugin within a few tenths of a second; a call that arrives before
the rest is ready waits for it (grpc_edge.servicers.LatePreparer). Then main.py wires the rest.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from dradriver import logs
from dradriver.kubeletplugin.grpc_edge.server import PluginServers
from dradriver.kubeletplugin.grpc_edge.servicers import LatePreparer, RegistrationHooks

log = logs.get_logger("kubeletplugin")


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.set())
    late, hooks = LatePreparer(), RegistrationHooks()
    servers = PluginServers(
        late,
        driver_name=args.driver_name,
        kubelet_dir=Path(args.kubelet_dir),
        instance=args.instance,
        on_registered=hooks.notify,
    )
    if too_long := [str(p) for p in servers.sockets() if len(str(p)) > 107]:
        log.error(
            "socket path longer than a Unix socket path may be (107 bytes): use a shorter "
            "--kubelet-dir (the kubelet's root) or --instance",
            sockets=",".join(too_long),
        )
        return 2
    try:
        servers.start()
    except (OSError, RuntimeError) as exc:
        log.error(
            "cannot serve the kubelet's sockets: --kubelet-dir must be the kubelet's root, "
            "writable by the plugin",
            kubelet_dir=args.kubelet_dir,
            error=str(exc),
        )
        servers.stop(grace=0)
        return 2
    log.info(
        "serving", dra_socket=str(servers.dra_socket), registration_socket=str(servers.reg_socket)
    )
    try:
        from dradriver.kubeletplugin.main import run_plugin
        from dradriver.kubeletplugin.options import OptionsError, parse

        try:  # a combination that cannot work is refused before anything else
            opts = parse(args)
        except OptionsError as exc:
            log.error(exc.what, error=exc.why)
            return 2
        return run_plugin(opts, stop, servers, late=late, hooks=hooks)
    finally:
        servers.stop()
