"""At a graceful stop: was the driver uninstalled from this node (its DaemonSet deleted or
being deleted)? Then tidy its state directory (state/tidy.py says what); any doubt keeps
everything. See docs/design.md, "Startup and restart".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dradriver import logs
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.options import PluginOptions
from dradriver.kubeletplugin.state.checkpoint.store import CheckpointStore
from dradriver.kubeletplugin.state.files import FileLock
from dradriver.kubeletplugin.state.ledger import Ledger
from dradriver.kubeletplugin.state.tidy import (
    Leftovers,
    apply_tidy,
    entries_of,
    keep_reason,
    plan_tidy,
)

log = logs.get_logger("kubeletplugin.uninstall")
# The stop has the rest of the pod's grace period for in-flight calls; this is one GET.
ASK_TIMEOUT = 5.0


def daemonset_gone(kube: Kube, owner: str) -> bool | None:
    """True: the DaemonSet `namespace/name` is deleted or being deleted (or the release's
    ServiceAccount or Role with it); False: it is there; None: unknown (no answer)."""
    namespace, _, name = owner.partition("/")
    try:
        ds = kube.get(path_for("apps/v1", "daemonsets", namespace, name=name), timeout=ASK_TIMEOUT)
    except NotFound:
        return True
    except (KubeError, OSError) as exc:
        if isinstance(exc, KubeError) and exc.status in (401, 403):
            # The pod's token (401) or the chart's Role for exactly this GET (403), valid
            # until now, gone: helm deletes the ServiceAccount and the RBAC in the same
            # pass as the DaemonSet, before its pods have stopped. Only the chart sets
            # --owner-daemonset, and a restart or an upgrade keeps both.
            log.info(
                "the plugin's ServiceAccount or Role is gone: taken as an uninstall",
                daemonset=owner,
                status=exc.status,
            )
            return True
        log.warning(
            "cannot tell whether the driver is uninstalled; keeping its state",
            daemonset=owner,
            error=str(exc),
        )
        return None
    return bool(ds.get("metadata", {}).get("deletionTimestamp"))


def leftovers(
    store: CheckpointStore, state_dir: Path, registry_dir: Path, *, driver: str
) -> Leftovers:
    # load(), not peek(): a damaged checkpoint is moved aside (and kept), never read as
    # empty and removed.
    with FileLock(state_dir / "plugin.lock", timeout=ASK_TIMEOUT):
        checkpoint = store.load()
    ledger = Ledger.of(state_dir).load()
    return Leftovers(
        claims=tuple(sorted(checkpoint.claims)),
        mig_changes=(
            *(f"MIG mode on {g}" for g in sorted(ledger.mig_enabled)),
            *(f"MIG mode off {g}" for g in sorted(ledger.mig_disabled)),
            *(f"instance {i.gpu_instance_id} on {i.gpu_uuid}" for i in ledger.instances),
        ),
        sharing_claims=tuple(sorted(ledger.sharing_claims())),
        imex_claims=tuple(sorted(set(ledger.imex.values()))),
        other_instances=tuple(sorted(p.name for p in registry_dir.glob(f"{driver}*-reg.sock"))),
    )


def tidy_if_uninstalled(
    kube: Kube,
    opts: PluginOptions,
    store: CheckpointStore,
    *,
    registry_dir: Path,
    on_node: Sequence[Path] = (),
) -> bool:
    """Called once the servers are stopped (our own socket is gone), for the DaemonSet
    --owner-daemonset names. True if tidied. `on_node`: files (and emptied directories)
    the plugin wrote outside its state directory (the driver spec, the hook it
    installed), removed with it."""
    state_dir = opts.state_dir
    if daemonset_gone(kube, opts.owner_daemonset) is not True:
        return False
    try:
        left = leftovers(store, state_dir, registry_dir, driver=opts.driver_name)
    except Exception as exc:  # an unreadable state is a reason to keep it, never to crash
        log.warning(
            "the driver is uninstalled but its state cannot be read; keeping it",
            state_dir=str(state_dir),
            error=str(exc),
        )
        return False
    if reason := keep_reason(left):
        log.warning(
            "the driver is uninstalled; keeping its state", state_dir=str(state_dir), reason=reason
        )
        return False
    plan = plan_tidy(entries_of(state_dir))
    failed = apply_tidy(state_dir, plan)
    for path in on_node:
        try:
            if not path.is_dir():
                path.unlink(missing_ok=True)
            # A directory mounted into the plugin's pod (the chart mounts the driver's own
            # under plugins/) is the kubelet's to remove with the pod.
            elif not os.path.ismount(path):
                path.rmdir()  # only when empty: another instance's socket may be there
        except OSError:
            failed.append(str(path))
    log.info(
        "the driver is uninstalled: its state is removed",
        state_dir=str(state_dir),
        removed=len(plan.files),
        kept=",".join(plan.kept) or "-",
        failed=",".join(failed) or "-",
    )
    return True
