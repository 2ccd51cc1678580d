"""`dradriver kubelet-plugin`: wiring of discovery, publishing, the gRPC servers and the
operator endpoints. Each piece lives in its own module; this one only connects them."""

from __future__ import annotations

import argparse
import gc
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver import flags, logs
from dradriver.health.model import Health, HealthConfigError, Policy, parse_xids
from dradriver.inventory.node_devices import DeviceKind, MigMode, MigSwitching
from dradriver.k8s import Kube, KubeconfigError
from dradriver.k8s.server_line import ServerLine
from dradriver.kubeletplugin.devices.health import HealthOptions, NodeEvents, NodeHealth
from dradriver.kubeletplugin.devices.node_label import NodeLabel
from dradriver.kubeletplugin.devices.view import DeviceView
from dradriver.kubeletplugin.grpc_edge.late import LateDriver, RegistrationHooks
from dradriver.kubeletplugin.grpc_edge.server import PluginServers
from dradriver.kubeletplugin.hardware.mig import MigPreparer
from dradriver.kubeletplugin.ops.api_probe import SLICES, ApiProbe, slices_query
from dradriver.kubeletplugin.options import add_arguments
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore, current_boot_id
from dradriver.kubeletplugin.state.checkpoint.store import checkpoint_owned
from dradriver.kubeletplugin.state.files import FileLock, NodeLock
from dradriver.kubeletplugin.state.mig_ledger import MigModeLedger, held_instances
from dradriver.kubeletplugin.state.name_book import NameBook, prepared_names
from dradriver.nvml.library import DevicesSpecError, open_nvml
from dradriver.slices.consumable import ConsumableMode, ConsumableModeError
from dradriver.slices.consumable import from_flags as consumable_from_flags
from dradriver.slices.publish import PublishLoop, SlicePublisher
from dradriver.slices.taints import TaintEffect
from dradriver.slices.watch import SliceWatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from dradriver.kubeletplugin.ops.server import OpsServer
    from dradriver.kubeletplugin.prepare.preparer import Preparer
    from dradriver.slices.build import SliceContent

log = logs.get_logger("kubeletplugin")

__all__ = ["add_arguments", "run_plugin"]


# The kubelet scans its plugin registry within seconds; after this long without being
# accepted, the likeliest cause is a socket in a directory the kubelet does not watch.
REGISTRATION_PATIENCE = 45.0
# How long the rest of startup waits for the first round of publishing (an API server
# that hangs must not keep the operator endpoints down).
FIRST_ROUND_PATIENCE = 2.0


def not_registered_message(kubelet_dir: Path, waited: float) -> str:
    return (
        f"not registered with the kubelet after {waited:.0f} s: it probably does not watch "
        f"{kubelet_dir / 'plugins_registry'}, where the registration socket is; set "
        "--kubelet-dir (Helm kubeletDir) to the kubelet's --root-dir (default /var/lib/kubelet)"
    )


@dataclass
class _Registration:
    refused: str = ""  # the kubelet's reason, when it refused us
    since: float = field(default_factory=time.monotonic)  # waiting since
    warned: bool = False


def run_plugin(
    args: argparse.Namespace,
    stop: threading.Event,
    servers: PluginServers,
    late: LateDriver,
    hooks: RegistrationHooks,
) -> int:
    """Everything after the sockets (startup.py): discovery, the checkpoint, publishing,
    the operator endpoints; the sockets start answering once the driver is set."""
    try:  # a combination that cannot work is refused before anything else
        consumable = consumable_from_flags(args.consumable_capacity, args.mig_mode)
    except ConsumableModeError as exc:
        log.error("bad --consumable-capacity", error=str(exc))
        return 2
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        nvml = open_nvml(args.devices, node=args.node_name, state_dir=state_dir, owner=True)
    except DevicesSpecError as exc:
        log.error("bad --devices", error=str(exc))
        return 2
    try:
        health_options = HealthOptions(
            Policy(parse_xids(args.health_skip_xids), args.health_recovery_probes),
            TaintEffect(args.health_taint_effect),
            args.health_probe_period,
        )
    except (HealthConfigError, ValueError) as exc:
        log.error("bad health flags", error=str(exc))
        return 2
    try:
        kube = Kube.from_kubeconfig(args.kubeconfig)
    except KubeconfigError as exc:  # every failure of the library's loaders, in one line
        log.error(
            "cannot load the kubeconfig: pass --kubeconfig, or run in a pod",
            error=str(exc),
            kubeconfig=args.kubeconfig or "(in-cluster, then ~/.kube/config)",
        )
        return 2
    # Asked now, answered while NVML discovers: the first slices are laid out for it.
    server = ServerLine(kube)
    server.prefetch()
    store = CheckpointStore(state_dir / "checkpoint.json", current_boot_id())
    mode = MigMode(args.mig_mode)
    switching = MigSwitching(args.mig_mode_switching)
    # Published partitions must include the ones our claims hold (they exist as MIG
    # devices now, but they are ours, not foreign).
    mig_ledger = MigModeLedger(state_dir / "mig-mode.json")
    health = NodeHealth(
        nvml.module,
        driver=args.driver_name,
        state_dir=state_dir,
        options=health_options,
        events=NodeEvents(kube, args.node_name),
    )
    view = DeviceView(
        nvml,
        mode,
        checkpoint_owned(store),  # the publish thread: never load() without the lock
        switching,
        lambda owned: held_instances(mig_ledger, owned),
        flags.mig_profiles(args.mig_profiles),
        health,
        consumable,
        imex_channels=args.imex_channels == "on",
        line=server.line,
    )
    late.reason = lambda: view.last_error or "loading the checkpoint"
    names = NameBook(state_dir / "device-names.json")

    node_label = NodeLabel(kube, args.node_name)

    discovered: list[Callable[[], None]] = []  # what follows each discovery

    def discover() -> list[SliceContent]:
        slices = view.refresh()
        for then in discovered:
            then()
        names.learn({d.gpu.uuid: d.gpu for d in view.devices().values()}.values())
        if view.clique is not None or node_label.labelled:
            node_label.sync(view.clique)
        return slices

    registered = threading.Event()
    # Why the kubelet has not accepted us: its refusal, or how long we have waited.
    registration = _Registration()
    kubelet_dir = Path(args.kubelet_dir)

    def registration_ready() -> tuple[bool, str]:
        if registered.is_set():
            return True, "registered"
        if registration.refused:
            return False, f"the kubelet refused the registration: {registration.refused}"
        waited = time.monotonic() - registration.since
        if waited > REGISTRATION_PATIENCE:
            return False, not_registered_message(kubelet_dir, waited)
        return False, "waiting for the kubelet"

    # Probing from now: /readyz's first answer is the API server's, not "not checked yet".
    api = ApiProbe(kube, SLICES, slices_query(args.node_name, args.driver_name))
    api.start()
    publisher = SlicePublisher(kube, args.driver_name, args.node_name, server_line=server)
    publisher.start_prefetch()
    loop = PublishLoop(publisher, discover, period=args.rediscover_period)

    def server_changed() -> None:
        server.forget()  # an upgraded control plane may want another layout
        loop.trigger()

    watch = SliceWatch(
        kube, args.driver_name, args.node_name, lambda why: loop.trigger(), server_changed
    )
    publisher.on_written, publisher.on_deleted = watch.wrote, watch.deleted

    def slices_ready() -> tuple[bool, str]:
        # What the API server holds, not what was last written.
        if not loop.published.is_set():
            return False, loop.last_error or "not published yet"
        wanted = loop.last_stats.devices if loop.last_stats else 0
        if watch.synced.is_set() and wanted and not watch.devices_held():
            return False, "the API server holds none of this node's slices; republishing"
        return True, loop.last_error or "published"

    # Filled in once the checkpoint is loaded (the ops server starts before that).
    preparers: list[Preparer] = []

    def checkpoint_ready() -> tuple[bool, str]:
        if not preparers:
            return False, "not loaded yet"
        return not preparers[0].refusal, preparers[0].refusal or "ok"

    def start_ops() -> OpsServer:
        # http.server and what it imports: a twentieth of a second of CPU, not spent on
        # the way to the first slice when discovery succeeds at once.
        from dradriver.kubeletplugin.ops.server import OpsServer

        ops = OpsServer(
            args.healthz_address,
            args.healthz_port,
            None,  # set once the prepare side exists (below)
            live={"process": lambda: (True, "serving")},
            ready={
                "discovery": lambda: (view.discovered.is_set(), view.last_error or "ok"),
                "registration": registration_ready,
                "api": api.check,
                "slices": slices_ready,
                "checkpoint": checkpoint_ready,
            },
        )
        ops.start()
        log.info("operator endpoints up", healthz_port=ops.port)
        return ops

    log.info(
        "starting",
        node=args.node_name,
        driver=args.driver_name,
        devices=args.devices,
        mig_mode=args.mig_mode,
        instance=args.instance,
    )

    # Nothing is published and nothing registers before the devices are known. NVML stays
    # initialised for the life of the process (MIG carving needs it; init is slow). The
    # operator endpoints come up after the first discovery, or at its first failure, so
    # that /readyz says why it keeps failing.
    ops: OpsServer | None = None
    backoff = 1.0
    while not stop.is_set():
        try:
            nvml.init()
            loop.first = discover()
            break
        except Exception as exc:
            view.last_error = f"NVML layer: {exc}"
            log.error(
                "device discovery failed; retrying", error=str(exc), retry_in=f"{backoff:.0f}s"
            )
            if ops is None:
                ops = start_ops()
            stop.wait(backoff)
            backoff = min(60.0, backoff * 2)
    if stop.is_set():
        if ops is not None:
            ops.stop()
        return 0
    # Published as soon as the devices are known: the checkpoint's own partitions are
    # read from it directly (DeviceView), so this need not wait for the reconcile below.
    publisher_thread = threading.Thread(target=loop.run, args=(stop,), name="publish", daemon=True)
    publisher_thread.start()
    # Nothing can be prepared before the node's devices are published (the scheduler
    # allocates from the slices): what only prepares and the operator endpoints need is
    # imported once the first round has ended, not on the way to the first slice, whose
    # thread would otherwise share the interpreter with a tenth of a second of imports.
    loop.attempted.wait(FIRST_ROUND_PATIENCE)
    if ops is None:
        ops = start_ops()
    from dradriver.kubeletplugin.hardware.shares import mps_protocol
    from dradriver.kubeletplugin.hardware.sharing import SharingSteps
    from dradriver.kubeletplugin.ops.metrics import Metrics
    from dradriver.kubeletplugin.prepare import cdi, wiring
    from dradriver.kubeletplugin.prepare.claim_status import StatusWriter
    from dradriver.kubeletplugin.prepare.execute import Executor
    from dradriver.kubeletplugin.prepare.preparer import Preparer
    from dradriver.nvml.mig import MigCarver

    metrics = Metrics()
    ops.metrics = metrics
    threading.Thread(target=watch.run, args=(stop,), name="slice-watch", daemon=True).start()
    signal.signal(signal.SIGHUP, lambda s, f: loop.trigger())
    # Each health change: one publish (the taints) and one message on every health stream.
    health.listeners += [loop.trigger, servers.health.changed]
    health.start(stop, lambda: view.devices().values())
    servers.health.attach(args.node_name, health.health_reports)

    status = StatusWriter(kube, args.driver_name) if args.claim_status == "on" else None
    mig = None
    if mode is MigMode.DYNAMIC:
        mig = MigPreparer(MigCarver(nvml.module), mig_ledger, switching)
    pod_memory = None
    if consumable.mode is not ConsumableMode.OFF:
        from dradriver.kubeletplugin.hardware.pod_memory import PodMemory

        pod_memory = PodMemory(nvml.module, Path(args.cgroup_root))
        pod_memory.probe(
            next((d.uuid for d in view.devices().values() if d.kind is DeviceKind.GPU), None)
        )
    writer = cdi.CdiWriter(Path(args.cdi_dir), args.driver_name)
    executor = Executor(
        driver=args.driver_name,
        cdi_writer=writer,
        host=nvml.host,
        profiles=view.profiles,
        mig=mig,
        sharing=SharingSteps(
            nvml.module, nvml.host, state_dir / "mps", lambda: mps_protocol(view.driver_version)
        ),
        pod_memory=pod_memory,
        imex=wiring.imex_steps(args, kube, nvml.host, state_dir, lambda: view.clique),
        driver_spec=wiring.driver_spec(args, writer, lambda: view.driver_release),
    )
    if executor.driver_spec is not None:
        executor.driver_spec.try_ensure()
        discovered.append(executor.driver_spec.try_ensure)  # a new driver: a new spec
    driver = Preparer(
        driver=args.driver_name,
        node=args.node_name,
        kube=kube,
        store=store,
        executor=executor,
        lock=NodeLock(FileLock(state_dir / "plugin.lock")),
        devices=view.devices,
        metrics=metrics,
        status=status,
        consumable=consumable,
        names=names.snapshot,
    )
    preparers.append(driver)
    reconciled = driver.reconcile()
    if executor.imex is not None:
        from dradriver.kubeletplugin.binding import binder

        def prepared() -> set[str]:
            cp = store.load()
            return set(cp.claims) | set(cp.unreadable)

        view.imex_binding = (
            binder.start(
                args.imex_binding_conditions,
                kube,
                args.driver_name,
                args.node_name,
                executor.imex,
                driver.lock,
                prepared,
                stop,
            )
            is not None
        )
        if view.imex_binding:
            loop.trigger()  # the channel device again, with its binding conditions
    # What an earlier release published its claims' devices as (by NVML index, before
    # names followed the UUID): a claim allocated under such a name is refused, naming its GPU.
    names.seed(prepared_names(store.cached))
    if reconciled:
        # The first discovery saw the checkpoint before the undo: a partition it held
        # then is free now, and a refresh racing the undo may have seen neither.
        loop.trigger()

    def on_registered(ok: bool, error: str) -> None:
        registration.refused = "" if ok else error
        if not ok and not error:  # the socket was recreated: waiting again
            registration.since = time.monotonic()
        metrics.registered.set(1 if ok else 0)
        if ok:
            registered.set()
            # The kubelet wipes a node's slices when it (re)starts: the same devices
            # again, without the discovery the startup has just made.
            loop.republish()
        else:
            registered.clear()

    hooks.attach(on_registered)
    # What startup built (modules, the device model, a fake node's machine) lives as long
    # as the process. Left to the collector, every full collection walks it all while
    # holding the GIL: some 30 ms in which no call is answered. Frozen, it is never
    # walked; what calls allocate later is collected as before.
    gc.freeze()
    late.set(driver)
    log.info("ready for the kubelet's calls", claims=len(driver.store.load().claims))
    device_series: set[tuple[str, str, str]] = set()
    while not stop.wait(1.0):
        waited = time.monotonic() - registration.since
        if not registered.is_set() and waited > REGISTRATION_PATIENCE:
            if not registration.warned:
                log.warning(not_registered_message(kubelet_dir, waited))
                registration.warned = True
        else:
            registration.warned = False
        if watch.synced.is_set():
            metrics.published_devices.set(watch.devices_held())
        reasons: dict[str, int] = {}
        for skip in view.skipped:
            reasons[skip.reason] = reasons.get(skip.reason, 0) + 1
        metrics.gpus_left_out.clear()
        for reason, n in reasons.items():
            metrics.gpus_left_out.labels(reason).set(n)
        devices = view.devices()
        shown: set[tuple[str, str, str]] = set()
        for name, h in health.states(devices.values()).items():
            why = h.fault.reason if h.fault else ("unknown" if h.health is Health.UNKNOWN else "")
            labels = (name, devices[name].gpu.uuid, why)
            metrics.device_healthy.labels(*labels).set(1 if h.health is Health.HEALTHY else 0)
            shown.add(labels)
        # Series of devices gone or of a reason past: removed, never a scrape of none.
        for labels in device_series - shown:
            metrics.device_healthy.remove(*labels)
        device_series = shown
    log.info("stopping: no new calls, finishing in-flight ones")
    servers.stop()
    if status is not None:
        status.close()
    if args.owner_daemonset:
        from dradriver.kubeletplugin.uninstall import tidy_if_uninstalled

        tidy_if_uninstalled(
            kube,
            args.owner_daemonset,
            store,
            state_dir,
            servers.registry_dir,
            args.driver_name,
            executor.driver_spec.on_node() if executor.driver_spec else (),
        )
    ops.stop()
    log.info("stopped")
    return 0
