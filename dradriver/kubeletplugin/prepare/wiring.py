"""The steps of prepare that the plugin's flags turn on, built from them: IMEX channels and
their daemons (--imex-channels on), and the driver's files through CDI (--driver-files
cdi). Each is imported only when it is on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.prepare.cdi import CdiWriter
from dradriver.logs import get_logger
from dradriver.nvml.host import GpuHost

log = get_logger("kubeletplugin.wiring")

if TYPE_CHECKING:
    from dradriver.kubeletplugin.daemons import Daemons
    from dradriver.kubeletplugin.hardware.imex import ImexSteps
    from dradriver.kubeletplugin.options import PluginOptions
    from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec


def imex_steps(
    opts: PluginOptions,
    kube: Kube,
    host: GpuHost,
    *,
    daemons: Daemons,
    clique: Callable[[], str | None],
) -> ImexSteps | None:
    """ComputeDomains' channels and IMEX daemons, where channels are published."""
    if not opts.imex_channels:
        return None
    from dradriver.api import computedomain as cd
    from dradriver.errors import ImexError
    from dradriver.kubeletplugin.hardware.imex import ImexSteps

    def domain_of(namespace: str, name: str) -> dict[str, Any]:
        try:
            return kube.get(path_for(cd.API_VERSION, cd.PLURAL, namespace, name=name), timeout=10)
        except NotFound as exc:
            raise ImexError(
                f"ComputeDomain {namespace}/{name} not found: it was deleted (delete the "
                "job's pods too), or the claim was not made from its template",
                reason="imex_no_domain",
            ) from exc
        except KubeError as exc:
            raise ImexError(
                f"reading ComputeDomain {namespace}/{name}: {exc.message}; the kubelet retries",
                reason="imex_api",
            ) from exc

    return ImexSteps(
        host,
        daemons,
        opts.node_name,
        opts.state_dir,
        domain_of,
        clique,
        opts.imex_port,
        opts.imex_cmd_port,
    )


def driver_spec(
    opts: PluginOptions, writer: CdiWriter, version: Callable[[], str]
) -> DriverSpec | None:
    """The node's driver spec, kept for the driver `version()` names; None where the
    runtime brings the driver (--driver-files runtime), whose spec is then removed: a
    claim prepared from now names none, and one prepared before keeps working."""
    if not opts.driver_files:
        writer.remove_driver()
        return None
    from dradriver.kubeletplugin.hardware.driver_files import (
        DriverFiles,
        DriverFilesError,
        install_hook,
    )
    from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec

    hook, installed = opts.cdi_hook_path, None
    if not hook:
        try:
            hook = install_hook(opts.kubelet_dir / "plugins" / opts.driver_name)
            installed = Path(hook)
        except DriverFilesError as exc:
            log.error("no nvidia-cdi-hook for the driver spec", error=str(exc))
            # Where NVIDIA's container toolkit packages install it: the node may have one.
            hook = "/usr/bin/nvidia-cdi-hook"
    files = DriverFiles(
        driver_root=opts.driver_root, host_driver_root=opts.host_driver_root, hook_path=hook
    )
    return DriverSpec(files, writer, version, installed_hook=installed)
