"""A local Kubernetes control plane for development and end-to-end tests.

Runs the real etcd, kube-apiserver, kube-scheduler and kube-controller-manager (built
from their Go modules by tools/controlplane/build.sh) on loopback ports, with
Node,RBAC authorization and working ServiceAccount tokens. Nodes are added with
`dradriver dev kubelet` (hollow nodes running the real kubelet, hollow_node.py). `up`
also applies the driver's DeviceClasses and, when asked, starts the admission webhook
(addons.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dradriver.k8s.lines import OLDEST, Line, line
from dradriver_dev.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "controlplane" / "build.sh"
# The Kubernetes line the dev cluster, its hollow nodes and the tests run (`K8S=1.37 make
# test`): built from tools/controlplane's module file for that line.
LINE_ENV = "K8S"

# With `alpha`, every gate of a feature the driver has that is off by default on the
# cluster's line (dradriver.k8s.lines: all six on 1.34 and 1.35, none from 1.36), on all
# three components at once, because a gate on the API server alone lets fields in that
# the scheduler ignores. ResourceHealthStatus is the kubelet's DRA health service;
# kube-apiserver drops the pods' allocatedResourcesStatus the kubelet writes from it
# unless it has the gate too.
ALPHA_GATES = OLDEST.gates_to_turn_on()
# Served with the gates, so that a glance at discovery tells an alpha cluster (and
# `dradriver dev kubelet` gives its kubelet the gates); DeviceTaintRule lives there.
ALPHA_RUNTIME_CONFIG = "resource.k8s.io/v1alpha3=true"
# With `gang`, the scheduler's own all-or-nothing placement (pkg/scheduler/framework/
# plugins/gangscheduling): PodGroups and Workloads (scheduling.k8s.io/v1beta1, served only
# when asked) behind GenericWorkload, beta and off by default in 1.37, and the placement
# of a whole group in one topology domain behind TopologyAwareWorkloadScheduling (alpha).
GANG_FROM = 37
GANG_GATES = ("GenericWorkload", "TopologyAwareWorkloadScheduling")
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
SERVICE_CIDR = "10.96.0.0/24"
# Processes `up` starts beside the control plane (addons.py) when asked. One that has
# exited leaves the cluster usable: `up` restarts it (or takes its configuration away)
# instead of calling the cluster broken.
WEBHOOK_PROCESS = "dradriver-controller"
ADDON_PROCESSES = frozenset({WEBHOOK_PROCESS})


class ClusterError(RuntimeError):
    pass


def current_line() -> Line:
    """The line $K8S names (1.34 when unset)."""
    try:
        return line(os.environ.get(LINE_ENV) or OLDEST.name)
    except ValueError as exc:
        raise ClusterError(f"{LINE_ENV}={os.environ.get(LINE_ENV)}: {exc}") from exc


def alpha_gates(ln: Line) -> tuple[str, ...]:
    """The gates `alpha` turns on for the line."""
    return ln.gates_to_turn_on()


@dataclass
class ClusterState:
    """What `up` started, saved as <state_dir>/cluster.json for `down` and for tests."""

    state_dir: str
    bin_dir: str
    kubeconfig: str
    server: str
    alpha: bool
    ports: dict[str, int] = field(default_factory=dict)
    gang: bool = False
    k8s: str = OLDEST.name  # the Kubernetes line, "1.37"
    controllers: str = "*"  # kube-controller-manager's --controllers
    pids: dict[str, int] = field(default_factory=dict)

    def save(self) -> None:
        Path(self.state_dir, "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> ClusterState | None:
        try:
            return cls(**json.loads((state_dir / "cluster.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None


def build_binaries(ln: Line | None = None) -> Path:
    """Builds (or finds cached) control-plane binaries of the line (default: $K8S);
    progress goes to stderr."""
    ln = ln or current_line()
    if not BUILD_SCRIPT.exists():
        raise ClusterError(f"{BUILD_SCRIPT} is missing: run from a dradriver checkout")
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, LINE_ENV: ln.name},
    )
    if proc.returncode != 0:
        raise ClusterError(
            f"building the Kubernetes {ln.name} control plane failed (exit {proc.returncode})"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _make_pki(pki: Path) -> None:
    """A throwaway CA, an API server serving certificate for loopback, and the
    ServiceAccount token signing key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = pki / "ca.key", pki / "ca.crt"
    _openssl("genrsa", "-out", str(ca_key), "2048")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(ca_key),
        "-days",
        "30",
        "-subj",
        "/CN=dradriver-dev-ca",
        "-out",
        str(ca_crt),
    )
    srv_key, srv_csr, srv_crt = pki / "apiserver.key", pki / "apiserver.csr", pki / "apiserver.crt"
    _openssl("genrsa", "-out", str(srv_key), "2048")
    _openssl(
        "req", "-new", "-key", str(srv_key), "-subj", "/CN=kube-apiserver", "-out", str(srv_csr)
    )
    ext = pki / "apiserver.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(srv_csr),
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        str(ext),
        "-out",
        str(srv_crt),
    )
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def _write_kubeconfig(path: Path, server: str, ca: Path, token: str) -> None:
    import base64

    ca_data = base64.b64encode(ca.read_bytes()).decode()
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: dradriver-dev\n  cluster:\n"
        f"    server: {server}\n    certificate-authority-data: {ca_data}\n"
        "users:\n- name: admin\n  user:\n"
        f"    token: {token}\n"
        "contexts:\n- name: dradriver-dev\n"
        "  context:\n    cluster: dradriver-dev\n    user: admin\n"
        "current-context: dradriver-dev\n"
    )
    path.chmod(0o600)


def _start(name: str, argv: list[str], logs: Path) -> int:
    log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still "exists"; reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    # Another's zombie too: a process started by an earlier `up`, whose parent has exited,
    # waits as one until its new parent reaps it, which some init processes never do.
    if not Path("/proc/self/stat").exists():
        return True  # no /proc (macOS): kill(0) is all there is to go by
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # gone since kill(0)
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_http(
    name: str,
    url: str,
    pid: int,
    logs: Path,
    deadline: float,
    ctx: ssl.SSLContext | None = None,
    token: str | None = None,
) -> None:
    last = ""
    while time.monotonic() < deadline:
        if not _alive(pid):
            tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ClusterError(f"{name} exited during start-up; last log lines:\n{tail}")
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ClusterError(f"{name} not healthy at {url} in time ({last}); see {logs / name}.log")


def up(
    state_dir: Path,
    *,
    alpha: bool = False,
    bin_dir: Path | None = None,
    timeout: float = 120.0,
    controllers: str = "*",
    replace: bool = False,
    replace_partial: bool = False,
    webhook: bool = False,
    k8s: Line | None = None,
    gang: bool = False,
) -> ClusterState:
    """Starts the control plane of the Kubernetes line `k8s` (default: $K8S, else 1.34)
    and returns once the API server is ready, the scheduler
    and controller-manager report healthy and the DeviceClasses are applied (with
    `webhook`, once the admission webhook refuses bad configs). A cluster already running
    there is kept (and returned, its DeviceClasses applied again, the webhook started if
    asked for) unless `replace`; one that runs only in part is never replaced silently:
    an error says so, unless `replace` or `replace_partial`."""
    from dradriver_dev import addons

    state_dir = state_dir.resolve()
    ln = k8s or current_line()
    if gang and ln.minor < GANG_FROM:
        raise ClusterError(
            f"the scheduler's gang scheduling is a Kubernetes 1.{GANG_FROM} feature; this "
            f"cluster would be {ln.name} (Kueue places a job whole on every line)"
        )
    existing = ClusterState.load(state_dir)
    if existing and not replace:
        alive = {n: _alive(p) for n, p in existing.pids.items() if n not in ADDON_PROCESSES}
        if all(alive.values()):
            if (existing.alpha, existing.gang, existing.k8s) != (alpha, gang, ln.name):
                raise ClusterError(
                    f"a Kubernetes {existing.k8s} cluster with alpha={existing.alpha} "
                    f"gang={existing.gang} is "
                    f"already running in {state_dir}; run `make cluster-down` first, or "
                    "pass --replace"
                )
            addons.install(existing, webhook=webhook, deadline=time.monotonic() + timeout)
            return existing
        if any(alive.values()) and not replace_partial:
            dead = ", ".join(sorted(n for n, ok in alive.items() if not ok))
            raise ClusterError(
                f"a cluster in {state_dir} is running only in part ({dead} stopped); "
                "pass --replace (make cluster-up REPLACE=1) to start a new one, or "
                "`make cluster-down`"
            )
    if existing:
        down(state_dir)
    bin_dir = bin_dir or build_binaries(ln)
    for b in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        if not (bin_dir / b).exists():
            raise ClusterError(f"{bin_dir / b} missing: run tools/controlplane/build.sh")
    state_dir.mkdir(parents=True, exist_ok=True)
    logs, pki = state_dir / "logs", state_dir / "pki"
    logs.mkdir(exist_ok=True)
    _make_pki(pki)
    token = secrets.token_hex(16)
    (pki / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
    etcd_port, peer_port, api_port, sched_port, cm_port = free_ports(5)
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = state_dir / "kubeconfig"
    (state_dir / "kubectl").unlink(missing_ok=True)
    (state_dir / "kubectl").symlink_to(bin_dir / "kubectl")  # same release as the server
    _write_kubeconfig(kubeconfig, server, pki / "ca.crt", token)
    st = ClusterState(
        state_dir=str(state_dir),
        bin_dir=str(bin_dir),
        kubeconfig=str(kubeconfig),
        server=server,
        alpha=alpha,
        gang=gang,
        k8s=ln.name,
        controllers=controllers,
        ports={
            "etcd": etcd_port,
            "apiserver": api_port,
            "scheduler": sched_port,
            "controller-manager": cm_port,
        },
    )
    deadline = time.monotonic() + timeout
    try:
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        st.pids["etcd"] = _start(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=dev",
                f"--data-dir={state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=dev=http://127.0.0.1:{peer_port}",
                # A throwaway cluster: durability buys nothing and costs seconds per test.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            logs,
        )
        st.save()
        _wait_http("etcd", f"{etcd_url}/health", st.pids["etcd"], logs, deadline)
        _start_control_plane(st, ln, bin_dir, token, deadline)
        addons.install(st, webhook=webhook, deadline=deadline)
    except BaseException:
        down(state_dir, remove=False)
        raise
    return st


def _start_control_plane(
    st: ClusterState, ln: Line, bin_dir: Path, token: str, deadline: float
) -> None:
    """kube-apiserver (once etcd answers), then kube-scheduler and kube-controller-manager
    of line `ln`, each waited for until healthy; their pids go into `st`."""
    state_dir = Path(st.state_dir)
    logs, pki = state_dir / "logs", state_dir / "pki"
    kubeconfig = st.kubeconfig
    alpha = alpha_gates(ln) if st.alpha else ()
    gates = ",".join(f"{g}=true" for g in (*alpha, *(GANG_GATES if st.gang else ())))
    # The alpha API only where the line has alpha gates to turn on (1.34, 1.35).
    served = ",".join(
        (*([ALPHA_RUNTIME_CONFIG] if alpha else []), *([GANG_RUNTIME_CONFIG] if st.gang else []))
    )
    api_args = [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{st.ports['etcd']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={st.ports['apiserver']}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--api-audiences=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
    ]
    if ln.minor >= 37:
        # 1.37 refuses a loopback advertise address to the endpoint reconciler (the
        # `kubernetes` Service's endpoints: pkg/controlplane/instance.go, ValidateIP);
        # nothing here reaches the API server through that Service.
        api_args.append("--endpoint-reconciler-type=none")
    if gates:
        api_args.append(f"--feature-gates={gates}")
    if served:
        api_args.append(f"--runtime-config={served}")
    st.pids["kube-apiserver"] = _start("kube-apiserver", api_args, logs)
    st.save()
    ca_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    _wait_http(
        "kube-apiserver",
        f"{st.server}/readyz",
        st.pids["kube-apiserver"],
        logs,
        deadline,
        ca_ctx,
        token,
    )
    common = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--profiling=false",
    ]
    if gates:
        common.append(f"--feature-gates={gates}")
    sched_args = [str(bin_dir / "kube-scheduler"), *common]
    cm_args = [
        str(bin_dir / "kube-controller-manager"),
        *common,
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=false",
        f"--controllers={st.controllers}",
    ]
    _start_serving(
        st,
        {
            "kube-scheduler": ("scheduler", sched_args),
            "kube-controller-manager": ("controller-manager", cm_args),
        },
        deadline,
    )


def _start_serving(
    st: ClusterState, components: dict[str, tuple[str, list[str]]], deadline: float
) -> None:
    """Start components, each on its secure port (name -> port key, argv), together, and
    wait until each is healthy. A port was chosen when the cluster was made, maybe long
    before (an upgrade restarts a component on the same one), so another process may hold
    it now: then that component gets a new one, twice at most."""
    logs = Path(st.state_dir) / "logs"
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # they serve self-signed certs on loopback
    log_from: dict[str, int] = {}

    def start(name: str) -> None:
        key, argv = components[name]
        log = logs / f"{name}.log"
        log_from[name] = log.stat().st_size if log.exists() else 0
        st.pids[name] = _start(name, [*argv, f"--secure-port={st.ports[key]}"], logs)
        st.save()

    for name in components:
        start(name)
    for name, (key, _) in components.items():
        for attempt in range(3):
            url = f"https://127.0.0.1:{st.ports[key]}/healthz"
            try:
                _wait_http(name, url, st.pids[name], logs, deadline, insecure)
                break
            except ClusterError:
                with open(logs / f"{name}.log", "rb") as f:
                    f.seek(log_from[name])
                    taken = b"address already in use" in f.read()
                if not taken or attempt == 2:
                    raise
                (st.ports[key],) = free_ports(1)
                start(name)


def _stop(pid: int) -> None:
    """SIGTERM to the process group, SIGKILL after 10 s."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)


def upgrade(state_dir: Path, to: Line, *, timeout: float = 120.0) -> ClusterState:
    """The control plane of a running cluster replaced by line `to`'s, as an upgrade
    goes: etcd and its data, the ports, certificates and tokens stay; kube-apiserver,
    then kube-scheduler and kube-controller-manager are stopped and started anew (with
    `alpha`, the new line's gates). Nodes and plugins keep running through it."""
    st = ClusterState.load(state_dir.resolve())
    if st is None or running(state_dir) is None:
        raise ClusterError(f"no cluster runs in {state_dir} to upgrade")
    bin_dir = build_binaries(to)
    for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
        _stop(st.pids.pop(name))
    st.bin_dir, st.k8s = str(bin_dir), to.name
    kubectl = Path(st.state_dir) / "kubectl"
    kubectl.unlink(missing_ok=True)
    kubectl.symlink_to(bin_dir / "kubectl")
    token = (Path(st.state_dir) / "pki" / "tokens.csv").read_text().split(",", 1)[0]
    _start_control_plane(st, to, bin_dir, token, time.monotonic() + timeout)
    return st


def down(state_dir: Path, *, remove: bool = True) -> bool:
    """Stops everything `up` started in state_dir; True if anything was running."""
    state_dir = state_dir.resolve()
    st = ClusterState.load(state_dir)
    stopped = False
    if st:
        # Reverse start order: clients before the API server, the API server before etcd.
        for name in reversed(list(st.pids)):
            pid = st.pids[name]
            if not _alive(pid):
                continue
            stopped = True
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            end = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
    if state_dir.exists():
        # The daemons of prepared claims (`KEEP=1 make demo`), which the hollow nodes run
        # as processes of their own.
        from dradriver_dev.hollow_node import stop_host_processes

        stopped = stop_host_processes(state_dir) > 0 or stopped
    if remove and state_dir.exists():
        shutil.rmtree(state_dir, ignore_errors=True)
    return stopped


def running(state_dir: Path) -> ClusterState | None:
    """The cluster fully running in `state_dir`, if any."""
    existing = ClusterState.load(state_dir.resolve())
    core = [p for n, p in (existing.pids if existing else {}).items() if n not in ADDON_PROCESSES]
    if existing and core and all(_alive(p) for p in core):
        return existing
    return None
