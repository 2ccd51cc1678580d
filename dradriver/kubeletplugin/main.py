"""`dradriver kubelet-plugin`: wiring of discovery, publishing, the gRPC servers and the
operator endpoints, from the options parsed once (options.py). Each piece lives in its
own module; this one only connects them, in the order a start needs them."""

from __future__ import annotations

import gc
import signal
import threading
from typing import TYPE_CHECKING

from dradriver import logs
from dradriver.inventory.node_devices import DeviceKind, MigMode
from dradriver.k8s import Kube, KubeconfigError
from dradriver.k8s.server_line import ServerLine
from dradriver.kubeletplugin.device_view.health import NodeEvents, NodeHealth
from dradriver.kubeletplugin.device_view.node_label import NodeLabel
from dradriver.kubeletplugin.device_view.view import DeviceView
from dradriver.kubeletplugin.endpoints.api_probe import SLICES, ApiProbe, slices_query
from dradriver.kubeletplugin.endpoints.readiness import CheckpointCheck, Registration, slices_check
from dradriver.kubeletplugin.grpc_edge.server import PluginServers
from dradriver.kubeletplugin.grpc_edge.servicers import LatePreparer, RegistrationHooks
from dradriver.kubeletplugin.hardware.mig import MigPreparer
from dradriver.kubeletplugin.options import PluginOptions
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore, current_boot_id
from dradriver.kubeletplugin.state.checkpoint.store import checkpoint_owned
from dradriver.kubeletplugin.state.files import FileLock
from dradriver.kubeletplugin.state.ledger import Ledger, held_instances
from dradriver.kubeletplugin.state.name_book import NameBook
from dradriver.nvml.library import DevicesSpecError, open_nvml
from dradriver.slices.consumable import ConsumableMode
from dradriver.slices.publish import SlicePublisher
from dradriver.slices.publish_loop import PublishLoop
from dradriver.slices.watch import SliceWatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from dradriver.kubeletplugin.endpoints.server import OpsServer
    from dradriver.kubeletplugin.prepare.execute import Executor
    from dradriver.nvml.library import Nvml
    from dradriver.slices.build import SliceContent

log = logs.get_logger("kubeletplugin")

# How long the rest of startup waits for the first round of publishing (an API server
# that hangs must not keep the operator endpoints down).
FIRST_ROUND_PATIENCE = 2.0


def run_plugin(
    opts: PluginOptions,
    stop: threading.Event,
    servers: PluginServers,
    *,
    late: LatePreparer,
    hooks: RegistrationHooks,
) -> int:
    """Everything after the sockets (startup.py): discovery, the checkpoint, publishing,
    the operator endpoints; the sockets start answering once the preparer is set."""
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        nvml = open_nvml(opts.devices, node=opts.node_name, state_dir=opts.state_dir, owner=True)
    except DevicesSpecError as exc:
        log.error("bad --devices", error=str(exc))
        return 2
    try:
        kube = Kube.from_kubeconfig(opts.kubeconfig)
    except KubeconfigError as exc:  # every failure of the library's loaders, in one line
        log.error(
            "cannot load the kubeconfig: pass --kubeconfig, or run in a pod",
            error=str(exc),
            kubeconfig=opts.kubeconfig or "(in-cluster, then ~/.kube/config)",
        )
        return 2
    # Asked now, answered while NVML discovers: the first slices are laid out for it.
    server = ServerLine(kube)
    server.prefetch()
    store = CheckpointStore(opts.state_dir / "checkpoint.json", current_boot_id())
    # Published partitions must include the ones our claims hold (they exist as MIG
    # devices now, but they are ours, not foreign).
    ledger = Ledger.of(opts.state_dir)
    health = NodeHealth(
        nvml.module,
        driver=opts.driver_name,
        state_dir=opts.state_dir,
        options=opts.health,
        events=NodeEvents(kube, opts.node_name),
    )
    view = DeviceView(
        nvml,
        opts.mig_mode,
        checkpoint_owned(store),  # the publish thread: never load() without the lock
        switching=opts.mig_mode_switching,
        held=lambda owned: held_instances(ledger, owned),
        offered_profiles=opts.mig_profiles,
        health=health,
        consumable=opts.consumable,
        mps_v2_shares=opts.mps_v2_shares,
        imex_channels=opts.imex_channels,
        line=server.line,
    )
    late.reason = lambda: view.last_error or "loading the checkpoint"
    name_book = NameBook(opts.state_dir / "device-names.json")
    node_label = NodeLabel(kube, opts.node_name)
    discovered: list[Callable[[], None]] = []  # what follows each discovery

    def discover() -> list[SliceContent]:
        slices = view.refresh()
        for then in discovered:
            then()
        name_book.learn({d.gpu.uuid: d.gpu for d in view.devices().values()}.values())
        if opts.nvlink_domain_label:  # no clique: takes off only a label it put on
            node_label.sync(view.clique)
        return slices

    # Probing from now: /readyz's first answer is the API server's, not "not checked yet".
    api = ApiProbe(kube, SLICES, slices_query(opts.node_name, opts.driver_name))
    api.start()
    publisher = SlicePublisher(kube, opts.driver_name, opts.node_name, server_line=server)
    publisher.start_prefetch()
    loop = PublishLoop(publisher, discover, period=opts.rediscover_period)

    def server_changed() -> None:
        server.forget()  # an upgraded control plane may want another layout
        loop.trigger()

    watch = SliceWatch(
        kube, opts.driver_name, opts.node_name, lambda why: loop.trigger(), server_changed
    )
    publisher.on_written, publisher.on_deleted = watch.wrote, watch.deleted
    registration = Registration(opts.kubelet_dir)
    checkpoint_check = CheckpointCheck()  # ready once the checkpoint is loaded (below)

    def start_ops() -> OpsServer:
        # http.server and what it imports: a twentieth of a second of CPU, not spent on
        # the way to the first slice when discovery succeeds at once.
        from dradriver.kubeletplugin.endpoints.server import OpsServer

        ops = OpsServer(
            opts.healthz_address,
            opts.healthz_port,
            None,  # set once the prepare side exists (below)
            live={"process": lambda: (True, "serving")},
            ready={
                "discovery": lambda: (view.discovered.is_set(), view.last_error or "ok"),
                "registration": registration.check,
                "api": api.check,
                "slices": slices_check(loop, watch),
                "checkpoint": checkpoint_check,
            },
        )
        ops.start()
        log.info("operator endpoints up", healthz_port=ops.port)
        return ops

    log.info(
        "starting",
        node=opts.node_name,
        driver=opts.driver_name,
        devices=opts.devices,
        mig_mode=opts.mig_mode.value,
        instance=opts.instance,
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
    threading.Thread(target=loop.run, args=(stop,), name="publish", daemon=True).start()
    # Nothing can be prepared before the node's devices are published (the scheduler
    # allocates from the slices): what only prepares and the operator endpoints need is
    # imported once the first round has ended, not on the way to the first slice, whose
    # thread would otherwise share the interpreter with a tenth of a second of imports.
    loop.attempted.wait(FIRST_ROUND_PATIENCE)
    if ops is None:
        ops = start_ops()
    from dradriver.kubeletplugin.endpoints.metrics import Metrics

    metrics = Metrics()
    ops.metrics = metrics
    threading.Thread(target=watch.run, args=(stop,), name="slice-watch", daemon=True).start()
    signal.signal(signal.SIGHUP, lambda s, f: loop.trigger())
    # Each health change: one publish (the taints) and one message on every health stream.
    health.listeners += [loop.trigger, servers.health.changed]
    health.start(stop, lambda: view.devices().values())
    servers.health.attach(opts.node_name, health.health_reports)

    from dradriver.kubeletplugin.prepare.claim_status import StatusWriter
    from dradriver.kubeletplugin.prepare.preparer import Preparer

    executor = _executor(opts, kube, nvml, view=view, ledger=ledger)
    status = StatusWriter(kube, opts.driver_name) if opts.claim_status else None
    preparer = Preparer(
        driver=opts.driver_name,
        node=opts.node_name,
        kube=kube,
        store=store,
        executor=executor,
        lock=FileLock(opts.state_dir / "plugin.lock"),
        devices=view.devices,
        metrics=metrics,
        status=status,
        consumable=opts.consumable,
        name_book=name_book.snapshot,
    )
    if executor.driver_spec is not None:
        executor.driver_spec.try_ensure()
        discovered.append(executor.driver_spec.try_ensure)  # a new driver: a new spec
    checkpoint_check.refusal = lambda: preparer.refusal
    reconciled = preparer.reconcile()
    if executor.imex is not None:
        from dradriver.kubeletplugin.imex_binding import binder

        def prepared() -> set[str]:
            cp = store.load()
            return set(cp.claims) | set(cp.unreadable)

        binding = binder.start(
            opts.imex_binding_conditions,
            kube,
            opts.driver_name,
            node=opts.node_name,
            steps=executor.imex,
            lock=preparer.lock,
            prepared=prepared,
            stop=stop,
        )
        view.imex_binding = binding is not None
    if reconciled or view.imex_binding:
        # The first discovery saw the checkpoint before the undo: a partition it held
        # then is free now, and a refresh racing the undo may have seen neither. And the
        # channel device again, with its binding conditions.
        loop.trigger()

    def on_registered(ok: bool, error: str) -> None:
        registration.changed(ok, error)
        metrics.registered.set(1 if ok else 0)
        if ok:
            # The kubelet wipes a node's slices when it (re)starts: the same devices
            # again, without the discovery the startup has just made.
            loop.republish()

    hooks.attach(on_registered)
    # What startup built (modules, the device model, a fake node's machine) lives as long
    # as the process. Left to the collector, every full collection walks it all while
    # holding the GIL: some 30 ms in which no call is answered. Frozen, it is never
    # walked; what calls allocate later is collected as before.
    gc.freeze()
    late.set(preparer)
    log.info("ready for the kubelet's calls", claims=len(preparer.store.load().claims))
    while not stop.wait(1.0):
        registration.warn_once_waiting()
        devices = view.devices()
        states = health.states(devices.values())
        metrics.refresh(watch=watch, skipped=view.skipped, devices=devices, health=states)
    log.info("stopping: no new calls, finishing in-flight ones")
    servers.stop()
    if status is not None:
        status.close()
    if opts.owner_daemonset:
        from dradriver.kubeletplugin.uninstall import tidy_if_uninstalled

        tidy_if_uninstalled(
            kube,
            opts,
            store,
            registry_dir=servers.registry_dir,
            on_node=executor.driver_spec.on_node() if executor.driver_spec else (),
        )
    ops.stop()
    log.info("stopped")
    return 0


def _executor(
    opts: PluginOptions, kube: Kube, nvml: Nvml, *, view: DeviceView, ledger: Ledger
) -> Executor:
    """The prepare side's executor, over the hardware steps the options turn on."""
    from dradriver.inventory.versions import mps_protocol
    from dradriver.kubeletplugin.daemons.pods import DaemonPods
    from dradriver.kubeletplugin.daemons.spec import PodSite
    from dradriver.kubeletplugin.hardware.shares import ShareSteps
    from dradriver.kubeletplugin.hardware.sharing import SharingSteps
    from dradriver.kubeletplugin.prepare import cdi, wiring
    from dradriver.kubeletplugin.prepare.execute import Executor
    from dradriver.nvml.mig import MigCarver

    mig = None
    if opts.mig_mode is MigMode.DYNAMIC:
        mig = MigPreparer(MigCarver(nvml.module), ledger, opts.mig_mode_switching)
    pod_memory = None
    if opts.consumable.mode is not ConsumableMode.OFF:
        from dradriver.kubeletplugin.hardware.pod_memory import PodMemory

        pod_memory = PodMemory(nvml.module, opts.cgroup_root)
        pod_memory.probe(
            next((d.uuid for d in view.devices().values() if d.kind is DeviceKind.GPU), None)
        )
    writer = cdi.CdiWriter(opts.cdi_dir, opts.driver_name)
    site = PodSite(
        opts.node_name,
        opts.daemon_namespace,
        opts.daemon_image,
        host_driver_root=str(opts.host_driver_root),
    )
    daemons = DaemonPods(kube, site)
    # Time-slicing and MPS, and shares: the same host, daemons, MPS root and ledger.
    mps = (nvml.module, nvml.host, daemons, opts.state_dir / "mps", ledger)
    return Executor(
        driver=opts.driver_name,
        cdi_writer=writer,
        host=nvml.host,
        profiles=view.profiles,
        mig=mig,
        sharing=SharingSteps(*mps, shm_size=opts.mps_shm_size),
        shares=ShareSteps(
            *mps, protocol=lambda: mps_protocol(view.driver_version), shm_size=opts.mps_shm_size
        ),
        pod_memory=pod_memory,
        imex=wiring.imex_steps(opts, kube, nvml.host, daemons=daemons, clique=lambda: view.clique),
        driver_spec=wiring.driver_spec(opts, writer, lambda: view.driver_release),
    )
