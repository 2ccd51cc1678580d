"""`dradriver controller`: the validating admission webhook for claims and claim templates,
its TLS, and the caBundle of its webhook configuration; and the ComputeDomain controller,
on the replica that holds the Lease. Wiring only; the pieces are imported in run() so
that building the CLI's parser does not load X.509 and HTTP code."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver import DEFAULT_DRIVER_NAME, flags, logs

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from dradriver.controller.computedomain.leader import Election
    from dradriver.controller.fleet import FleetMetrics
    from dradriver.controller.tls import ServingTLS
    from dradriver.k8s import Kube

log = logs.get_logger("controller")
REFRESH_PERIOD = 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add(
        p,
        "--driver-name",
        DEFAULT_DRIVER_NAME,
        help="DRA driver name: configs whose opaque.driver is this are checked",
    )
    flags.add(p, "--webhook-address", "0.0.0.0", help="address the HTTPS webhook listens on")
    flags.add(p, "--webhook-port", "8443", help="port of the HTTPS webhook (0: any)", type=int)
    flags.add(
        p,
        "--webhook-config-name",
        "dradriver-admission",
        help="ValidatingWebhookConfiguration whose webhooks get our caBundle and failure policy",
    )
    flags.add(
        p,
        "--namespace",
        os.environ.get("POD_NAMESPACE") or "dradriver",
        help="namespace of the webhook's Service ($POD_NAMESPACE when set)",
    )
    flags.add(
        p,
        "--service-name",
        "dradriver-controller",
        help="Service in front of the webhook; the serving certificate is for "
        "<service>.<namespace>.svc",
    )
    flags.add(
        p,
        "--tls-cert-file",
        None,
        help="serving certificate (PEM, reloaded when it changes); with --tls-key-file, "
        "nothing is generated and the webhook configuration is not patched",
    )
    flags.add(p, "--tls-key-file", None, help="private key of --tls-cert-file (PEM)")
    flags.add(
        p,
        "--failure-policy",
        "Fail",
        help="failurePolicy patched into the webhooks with the caBundle: Fail refuses claims "
        "while the webhook is down, Ignore admits them unchecked",
        choices=["Fail", "Ignore"],
    )
    flags.add(
        p,
        "--healthz-port",
        "8080",
        help="plain HTTP port of /healthz and /readyz (0: any)",
        type=int,
    )
    flags.add(
        p,
        "--kubeconfig",
        os.environ.get("KUBECONFIG"),
        help="kubeconfig (default: $KUBECONFIG; with none, the pod's service account in a pod, "
        "else ~/.kube/config)",
    )
    flags.add(
        p,
        "--compute-domains",
        "on",
        help="reconcile ComputeDomains (multi-node NVLink); off: the webhook alone",
        choices=["on", "off"],
    )
    flags.add(
        p,
        "--channel-device-class",
        "imex-channel.dradriver.io",
        help="DeviceClass of IMEX channels that ComputeDomains' claim templates name",
    )
    flags.add(
        p,
        "--leader-election-lease",
        "dradriver-controller",
        help="Lease (in --namespace) the replicas elect the one ComputeDomain writer with",
    )
    flags.add(
        p,
        "--leader-election-id",
        os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's identity in the Lease ($POD_NAME when set, else the host name)",
    )
    flags.add(
        p,
        "--fleet-metrics",
        "off",
        help="export the fleet's GPUs (allocated, free, stranded by reason, tainted, shared, "
        "MIG, Pending claims by reason) on /metrics of --healthz-port, as dradriver fleet "
        "counts them: on or off (on watches slices, claims, classes, nodes, Pending pods)",
        choices=["on", "off"],
    )
    flags.add(
        p,
        "--fleet-period",
        "30",
        help="seconds between recomputations of the fleet's metrics (when something changed)",
        type=float,
    )
    flags.add(
        p,
        "--fleet-page",
        "off",
        help="with --fleet-metrics on: serve the fleet's picture at /fleet of --healthz-port "
        "(read-only; the claims and pods holding each GPU are named in it): on or off",
        choices=["on", "off"],
    )
    flags.add(
        p,
        "--fleet-group-label",
        "node.kubernetes.io/instance-type",
        help="the Node label whose value is a node's group in the fleet's metrics",
    )
    flags.add(p, "--log-level", "info", help="debug, info, warning or error")


def _serving_tls(args: argparse.Namespace) -> ServingTLS:
    from dradriver.controller import tls

    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if args.tls_cert_file:
        return tls.FileTLS(Path(args.tls_cert_file), Path(args.tls_key_file))
    return tls.SelfSignedTLS(tls.serving_names(args.service_name, args.namespace))


def _compute_domains(kube: Kube, args: argparse.Namespace, stop: threading.Event) -> Election:
    """Starts the ComputeDomain controller's watches at once (a replica that takes over
    has its mirrors filled) and its reconcile loop whenever this replica leads."""
    from dradriver.controller.computedomain.controller import ComputeDomainController
    from dradriver.controller.computedomain.leader import Election

    controller = ComputeDomainController(kube, args.driver_name, args.channel_device_class)
    controller.start(stop)
    election = Election(
        kube, args.namespace, args.leader_election_lease, identity=args.leader_election_id
    )
    election.start(lambda leading: controller.run(stop, leading), stop)
    return election


def _fleet(kube: Kube | None, args: argparse.Namespace) -> tuple[CollectorRegistry, FleetMetrics]:
    from prometheus_client import CollectorRegistry

    from dradriver.controller.fleet import FleetMetrics

    assert kube is not None
    return CollectorRegistry(), FleetMetrics(
        kube, period=args.fleet_period, group_label=args.fleet_group_label
    )


def run(args: argparse.Namespace) -> int:
    from dradriver.controller import server, tls
    from dradriver.controller.cabundle import CaBundleSyncer
    from dradriver.k8s import Kube, KubeconfigError

    logs.setup(args.log_level)
    try:
        serving = _serving_tls(args)
    except (ValueError, OSError) as exc:
        log.error("cannot set up TLS", error=str(exc))
        return 2

    syncer: CaBundleSyncer | None = None
    kube: Kube | None = None
    fleet_on = args.fleet_metrics == "on"
    if serving.ca_pem is not None or args.compute_domains == "on" or fleet_on:
        try:
            kube = Kube.from_kubeconfig(args.kubeconfig)
        except KubeconfigError as exc:  # whatever the library's loaders refused, one line
            log.error("cannot load the kubeconfig", error=str(exc), kubeconfig=args.kubeconfig)
            serving.close()
            return 2
    if serving.ca_pem is not None:
        assert kube is not None
        syncer = CaBundleSyncer(
            kube,
            args.webhook_config_name,
            lambda: serving.ca_pem or b"",
            failure_policy=args.failure_policy,
            clock=tls.utcnow,
        )

    def ca_check() -> tuple[bool, str]:
        if syncer is None:
            return True, "certificate provided; the webhook configuration is not patched"
        return syncer.patched.is_set(), syncer.last_error or "patched"

    checks: dict[str, server.Check] = {"process": lambda: (True, "serving")}
    ready = {"tls": lambda: (True, serving.describe()), "caBundle": ca_check}
    registry, fleet = _fleet(kube, args) if fleet_on else (None, None)
    pages: dict[str, server.Page] = {}
    if registry is not None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        pages["/metrics"] = lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)
        if fleet is not None and args.fleet_page == "on":
            pages["/fleet"] = fleet.page
    try:
        webhook = server.Server(
            args.webhook_address,
            args.webhook_port,
            checks=checks,
            ready=ready,
            validate=lambda body: server.review(body, args.driver_name),
            tls=lambda: serving.context,
            name="webhook",
        )
        probes = server.Server(
            args.webhook_address,
            args.healthz_port,
            checks=checks,
            ready=ready,
            name="healthz",
            pages=pages,
        )
    except OSError as exc:
        log.error("cannot listen", error=str(exc), address=args.webhook_address)
        serving.close()
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.set())
    webhook.start()
    probes.start()
    if syncer is not None:
        # Daemon: a watch blocks for a minute at a time and must not hold up the exit.
        threading.Thread(target=syncer.run, args=(stop,), name="cabundle", daemon=True).start()
    if fleet is not None and registry is not None:
        fleet.start(stop, registry)
    election = None
    if kube is not None and args.compute_domains == "on":
        election = _compute_domains(kube, args, stop)
    log.info(
        "serving",
        driver=args.driver_name,
        webhook_port=webhook.port,
        healthz_port=probes.port,
        tls=serving.describe(),
        webhook_config=args.webhook_config_name if syncer else None,
        failure_policy=args.failure_policy if syncer else None,
    )
    while not stop.wait(REFRESH_PERIOD):
        try:
            if serving.refresh():
                log.info("serving certificate reloaded", tls=serving.describe())
        except (OSError, ValueError) as exc:
            log.warning(
                "reloading the serving certificate failed; keeping the old one", error=str(exc)
            )
    log.info("stopping")
    if election is not None:
        election.release()
    webhook.stop()
    probes.stop()
    serving.close()
    log.info("stopped")
    return 0
