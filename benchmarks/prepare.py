"""Prepare and unprepare of the kubelet plugin next to a floor and a Go driver, in one run.

Runs the real plugin process (fake GPUs) against the real local control plane, registered
with a hollow node (the real kubelet), and calls it over its real Unix socket the way the
kubelet does; the plugin reads every claim from the API server. Reports:

- the floor: a bare gRPC round trip on the plugin's socket + one GET of the claim with a
  raw HTTP client on a kept-alive connection + one fsync'd 1 KiB write, i.e. what one
  prepare cannot avoid, sampled once before each concurrency-1 cycle (the same load);
- prepare and unprepare p50/p99, and prepare+unprepare cycles/s at concurrency 1, 4, 16
  (distinct claims and devices);
- process start to registration socket, to GetInfo answering, to first ResourceSlice;
- RSS after the cycles, CPU seconds per 100 cycles of the plugin and of the API server +
  etcd, API requests per cycle by verb; the same API server + etcd CPU with claim status
  off (a driver that writes no status), for the ratio;
- each of issue Q8's targets (item 5: the design's libraries on the wire), met or not;
- side by side with a Go driver (tools/godriver: k8s.io/dynamic-resource-allocation's
  kubeletplugin helper, the same per-claim work: a CDI spec and an fsync'd checkpoint),
  both registered with the same hollow node, on the same API server, called by the same
  client in interleaved blocks at concurrency 1, 4 and 16: prepare and unprepare p50/p99,
  cycles/s, RSS and CPU of each, the ratios dradriver/Go, and issue Q21b's targets.

The plugin runs from byte-compiled modules, as it does from the image (pip compiles what
it installs): the checkout's are compiled first, or every start would measure the
compiler.

    .venv/bin/python benchmarks/prepare.py [--claims 1000] [--peer-only]
"""

from __future__ import annotations

import argparse
import base64
import compileall
import http.client
import itertools
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver.api import kubelet as kapi  # noqa: E402
from dradriver.k8s import Kube, NotFound, path_for  # noqa: E402
from dradriver_dev import cluster  # noqa: E402
from dradriver_dev.driver_files import plugin_env  # noqa: E402

RES = "resource.k8s.io/v1"
DRIVER = "gpu.dradriver.io"
GO_DRIVER = "gpu.godriver.dev"  # tools/godriver, the Go peer
NODE = "bench-node"
GPUS = 64
CONCURRENCY = (1, 4, 16)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


class RawGet:
    """GETs on one kept-alive HTTPS connection, without any client library: the floor."""

    def __init__(self, kubeconfig: str) -> None:
        doc = yaml.safe_load(Path(kubeconfig).read_text())
        c = doc["clusters"][0]["cluster"]
        u = urlparse(c["server"])
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(c["certificate-authority-data"]).decode()
        )
        self.conn = http.client.HTTPSConnection(u.hostname or "", u.port, context=ctx)
        self.headers = {
            "Authorization": f"Bearer {doc['users'][0]['user']['token']}",
            "Accept": "application/json",
        }

    def get(self, path: str) -> bytes:
        self.conn.request("GET", path, headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: {r.status}")
        return body


def dradriver_names() -> list[str]:
    """The names the plugin publishes its fake GPUs under (from their UUIDs)."""
    from dradriver.inventory.naming import stable_names
    from fakenvml.spec import parse
    from fakenvml.topology import build

    uuids = [g.uuid for g in build(parse(f"{GPUS}xH100-80GB"), NODE)]
    return [stable_names(uuids)[u] for u in uuids]


def make_claims(
    kube: Kube, ns: str, n: int, driver: str = DRIVER, names: list[str] | None = None
) -> list[tuple[str, str]]:
    """Claims allocated and reserved by hand: scheduling is not what is measured here.
    (The cluster runs without the resourceclaim controller, which would otherwise drop
    reservations for pods that do not exist.) Claim i gets GPU i mod 64, so concurrent
    workers, which take claims round-robin, hold distinct GPUs; `names` are the GPUs'
    names in the driver's slice (dradriver's by default)."""
    names = names or dradriver_names()
    prefix = "c" if driver == DRIVER else "g"
    out = []
    for i in range(n):
        name = f"{prefix}{i}"
        c = kube.create(
            path_for(RES, "resourceclaims", ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]
                    }
                },
            },
        )
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": driver,
                            "pool": NODE,
                            "device": names[i % GPUS],
                        }
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": f"p{i}", "uid": f"00000000-0000-0000-0000-{i:012d}"}
            ],
        }
        kube.replace(path_for(RES, "resourceclaims", ns, name=name, subresource="status"), c)
        out.append((name, c["metadata"]["uid"]))
    return out


@dataclass
class Run:
    workers: int
    prepare: list[float] = field(default_factory=list)
    unprepare: list[float] = field(default_factory=list)
    wall: float = 0.0

    @property
    def cycles_per_s(self) -> float:
        return len(self.prepare) / self.wall


def cycle(stub: Any, ns: str, name: str, uid: str) -> tuple[float, float]:
    """One NodePrepareResources + NodeUnprepareResources of one claim, as the kubelet
    makes them: their seconds."""
    m = kapi.dra_v1
    claim = m.Claim(namespace=ns, uid=uid, name=name)
    t = time.perf_counter()
    r = stub.NodePrepareResources(m.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
    t1 = time.perf_counter()
    if r.claims[uid].error:
        raise RuntimeError(r.claims[uid].error)
    u = stub.NodeUnprepareResources(m.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45)
    t2 = time.perf_counter()
    if u.claims[uid].error:
        raise RuntimeError(u.claims[uid].error)
    return t1 - t, t2 - t1


def run_at(
    sock: str,
    ns: str,
    claims: list[tuple[str, str]],
    workers: int,
    between: Callable[[], None] | None = None,
) -> Run:
    """Each worker owns the claims i with i mod workers == w: no two in flight share a GPU.
    `between` (one worker only) runs before each cycle, untimed."""
    run = Run(workers)
    lock = threading.Lock()

    def worker(chunk: list[tuple[str, str]]) -> None:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
            for name, uid in chunk:
                if between is not None:
                    between()
                prepare, unprepare = cycle(stub, ns, name, uid)
                with lock:
                    run.prepare.append(prepare)
                    run.unprepare.append(unprepare)

    # Claims are spread over the workers so that none two in flight share a GPU.
    chunks = [claims[w::workers] for w in range(workers)]
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, chunks))
    run.wall = time.perf_counter() - t
    return run


class Floor:
    """One floor sample: a bare gRPC round trip on the plugin's socket, a raw GET of the
    claim and an fsync'd 1 KiB write. Taken between the concurrency-1 cycles, so that the
    ratio compares the two under the same load (this machine's load moves by a third
    within a run)."""

    def __init__(self, sock: str, raw: RawGet, lib: Kube, ns: str, name: str, state: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self.stub = kapi.dra_v1_grpc.DRAPluginStub(self.channel)
        self.raw, self.lib, self.state = raw, lib, state
        self.path = path_for(RES, "resourceclaims", ns, name=name)
        self.samples: list[float] = []
        # Not part of the floor: its GET alone, and the same GET as the plugin makes it
        # (dradriver.k8s on urllib3, the JSON decoded), timed right after each sample.
        self.raw_gets: list[float] = []
        self.lib_gets: list[float] = []

    def sample(self) -> None:
        t = time.perf_counter()
        self.stub.NodeUnprepareResources(kapi.dra_v1.NodeUnprepareResourcesRequest(), timeout=10)
        g = time.perf_counter()
        self.raw.get(self.path)
        self.raw_gets.append(time.perf_counter() - g)
        tmp = self.state / "floor.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, b"x" * 1024)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, self.state / "floor")
        self.samples.append(time.perf_counter() - t)
        g = time.perf_counter()
        self.lib.get(self.path)
        self.lib_gets.append(time.perf_counter() - g)

    def close(self) -> None:
        self.channel.close()


def cdi_dir(on: str, work: Path) -> Path:
    """The plugin's CDI directory. On a node it is /var/run/cdi, which is /run, a tmpfs
    (systemd mounts it so; a reboot wipes the specs, and the plugin rewrites them from its
    checkpoint). The state directory stays on the disk, as /var/lib/dradriver is: its
    fsyncs are part of what a prepare costs there."""
    if on == "tmpfs":
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="drbench-cdi-", dir=shm))
        print("bench: no writable /dev/shm; the CDI specs go to the disk", flush=True)
    return work / "kubelet" / "cdi"


def wait_node_ready(kube: Kube, kubelet: subprocess.Popen[bytes], work: Path) -> None:
    """A starting kubelet deletes its node's slices: the plugin starts after it is up."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if kubelet.poll() is not None:
            raise RuntimeError(f"the kubelet exited; see {work / 'kubelet.log'}")
        try:
            node = kube.get(path_for("v1", "nodes", name=NODE))
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            ):
                return
        except NotFound:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"node {NODE} not Ready in 120s; see {work / 'kubelet.log'}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_parts(pid: int) -> dict[str, float]:
    """Where the RSS is, from /proc/PID/smaps (MiB): mapped files (the interpreter's,
    grpcio's and the other extensions' code and data, shared with any other process that
    maps them), the main heap, and anonymous mappings (Python's object arenas, malloc's
    per-thread arenas and large blocks, thread stacks; the kernel merges neighbours, so
    they are not told apart)."""
    parts = {"files": 0.0, "heap": 0.0, "anonymous": 0.0}
    kind = "anonymous"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            kind = "heap" if name == "[heap]" else "files" if name.startswith("/") else "anonymous"
        elif head[0] == "Rss:":
            parts[kind] += int(head[1]) / 1024
    return parts


def cpu_seconds(*pids: int) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


_REQ = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$", re.M)


def api_requests(kube: Kube) -> Counter[str]:
    """verb resource[/subresource] -> requests so far, for resource.k8s.io objects."""
    out: Counter[str] = Counter()
    for labels, value in _REQ.findall(kube.text("/metrics")):
        d = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if d.get("group") != "resource.k8s.io":
            continue
        what = d.get("resource", "") + ("/" + d["subresource"] if d.get("subresource") else "")
        out[f"{d.get('verb')} {what}"] += int(float(value))
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Plugin:
    """The plugin process, timed from its start to each milestone."""

    def __init__(
        self,
        work: Path,
        kube: Kube,
        kubeconfig: str,
        root: Path,
        state: Path,
        status: str,
        cdi: Path,
    ) -> None:
        # The first slice is this process's: none of a previous one is left.
        kube.delete_collection(
            path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={NODE}"
        )
        self.port = 18000 + os.getpid() % 1000
        self.root = root
        log = open(work / f"plugin-status-{status}.log", "wb")  # noqa: SIM115 - the child's
        for old in (root / "plugins_registry").glob(f"{DRIVER}*.sock"):
            old.unlink()
        # The first slice is seen on a watch opened before the start: polling the API
        # server every few milliseconds for it (as this benchmark first did) took CPU
        # from the two cores the plugin starts on, and delayed what it measured.
        self.first_slice = 0.0
        self.sliced = threading.Event()
        listed = kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={NODE}")
        threading.Thread(
            target=self._watch_slices,
            args=(kube, listed["metadata"]["resourceVersion"]),
            name="first-slice",
            daemon=True,
        ).start()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dradriver.cli",
                "kubelet-plugin",
                "--node-name",
                NODE,
                "--devices",
                f"fake:{GPUS}xH100-80GB",
                "--kubeconfig",
                kubeconfig,
                "--kubelet-dir",
                str(root),
                "--cdi-dir",
                str(cdi),
                "--state-dir",
                str(state),
                "--healthz-address",
                "127.0.0.1",
                "--healthz-port",
                str(self.port),
                "--claim-status",
                status,
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=plugin_env(),  # the driver's files in CDI, as the plugin's default
        )

    def _watch_slices(self, kube: Kube, since: str) -> None:
        for event in kube.watch(
            path_for(RES, "resourceslices"),
            resource_version=since,
            timeout_seconds=120,
            fieldSelector=f"spec.nodeName={NODE}",
        ):
            if event["type"] == "ADDED":
                self.first_slice = time.perf_counter() - self.t0
                self.sliced.set()
                return

    def until(self, what: str, ok: Any, timeout: float = 60) -> float:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the plugin exited before {what}")
            if ok():
                return time.perf_counter() - self.t0
            if time.perf_counter() - self.t0 > timeout:
                raise RuntimeError(f"plugin: no {what} in {timeout}s")
            time.sleep(0.002)

    def milestones(self, kube: Kube) -> dict[str, float]:
        reg = self.root / "plugins_registry"
        pattern = f"{DRIVER}*-reg.sock"
        out = {"registration socket": self.until("socket", lambda: any(reg.glob(pattern)))}
        sock = str(next(reg.glob(pattern)))

        def info() -> bool:
            try:
                with grpc.insecure_channel(f"unix://{sock}") as ch:
                    stub = kapi.registration_grpc.RegistrationStub(ch)
                    stub.GetInfo(kapi.registration.InfoRequest(), timeout=0.5)
                return True
            except grpc.RpcError:
                return False

        out["GetInfo answering"] = self.until("GetInfo", info)

        self.until("slice", self.sliced.is_set)
        out["first ResourceSlice"] = self.first_slice

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        out["ready (/readyz)"] = self.until("readiness", ready)
        return out

    def stop(self) -> None:
        stop(self.proc)


def godriver_binary() -> Path:
    """tools/godriver built (cached: a no-op when its sources have not changed)."""
    out = subprocess.run(
        ["bash", str(REPO / "tools" / "godriver" / "build.sh")],
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    ).stdout
    return Path(out.strip().splitlines()[-1]) / "godriver"


class GoDriver:
    """tools/godriver's process, the Go peer, on the same node as the plugin: registered
    with the same kubelet under its own name, its devices in its own slice."""

    def __init__(self, binary: Path, work: Path, kubeconfig: str, root: Path, cdi: Path) -> None:
        data = root / "plugins" / GO_DRIVER
        self.sock = data / "dra.sock"
        self.reg = root / "plugins_registry" / f"{GO_DRIVER}-reg.sock"
        self.log = work / "godriver.log"
        log = open(self.log, "wb")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            [
                str(binary),
                "--node-name",
                NODE,
                "--kubeconfig",
                kubeconfig,
                "--registrar-dir",
                str(root / "plugins_registry"),
                "--plugin-dir",
                str(data),
                "--cdi-dir",
                str(cdi),
                "--state-dir",
                str(work / "godriver-state"),
                "--devices",
                str(GPUS),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, kube: Kube, timeout: float = 60) -> None:
        """Until the kubelet has taken its registration (it logs the kubelet's answer)
        and its slice is published."""
        end = time.monotonic() + timeout
        slices = path_for(RES, "resourceslices")
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"godriver exited; see {self.log}")
            if (
                "registered=true" in self.log.read_text()
                and kube.list(slices, fieldSelector=f"spec.driver={GO_DRIVER}")["items"]
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"godriver: not registered with a slice in {timeout}s; see {self.log}")

    def stop(self) -> None:
        stop(self.proc)


@dataclass
class Side:
    """One driver of the side-by-side runs: its DRA socket, its claims, its process, and
    what was measured of it (a Run per concurrency, RSS after them, CPU per 100 cycles)."""

    name: str
    sock: str
    claims: list[tuple[str, str]]
    pid: int
    runs: list[Run] = field(default_factory=list)
    rss: float = 0.0
    cpu: float = 0.0


def block(
    pool: ThreadPoolExecutor, stub: Any, ns: str, claims: list[tuple[str, str]], run: Run
) -> None:
    """One block of cycles: claim k of the block to worker k mod run.workers (so no two
    in flight share a GPU, run_at's rule); its wall time added to the run's."""
    w = run.workers

    def worker(chunk: list[tuple[str, str]]) -> list[tuple[float, float]]:
        return [cycle(stub, ns, name, uid) for name, uid in chunk]

    t = time.perf_counter()
    done = list(pool.map(worker, [claims[k::w] for k in range(w)]))
    run.wall += time.perf_counter() - t
    for times in done:
        for prepare, unprepare in times:
            run.prepare.append(prepare)
            run.unprepare.append(unprepare)


def side_by_side(sides: list[Side], ns: str) -> None:
    """At each concurrency, blocks of each driver's cycles in turn (50 cycles, or 10 a
    worker at concurrency 16), the order reversed every other round so a drift in the
    host's load falls on both alike; one channel per driver, as the kubelet keeps one
    connection per plugin, and the same worker threads for both."""
    load = os.getloadavg()[0]
    channels = [grpc.insecure_channel(f"unix://{s.sock}") for s in sides]
    stubs = [kapi.dra_v1_grpc.DRAPluginStub(ch) for ch in channels]
    with ThreadPoolExecutor(max(CONCURRENCY)) as pool:
        for stub, side in zip(stubs, sides, strict=True):  # warm: connections, first calls
            block(pool, stub, ns, side.claims[:50], Run(4))
        cpu0 = [cpu_seconds(s.pid) for s in sides]
        for w in CONCURRENCY:
            size = max(50, 10 * w)
            runs = [Run(w) for _ in sides]
            for r in range(min(len(s.claims) for s in sides) // size):
                order = list(range(len(sides)))
                for i in order if r % 2 == 0 else reversed(order):
                    block(pool, stubs[i], ns, sides[i].claims[r * size : (r + 1) * size], runs[i])
            for side, run in zip(sides, runs, strict=True):
                side.runs.append(run)
    for side, c0 in zip(sides, cpu0, strict=True):
        side.cpu = (cpu_seconds(side.pid) - c0) / sum(len(r.prepare) for r in side.runs) * 100
        side.rss = rss_mib(side.pid)
    for ch in channels:
        ch.close()
    # The host's other work, which weighs on the driver that spends more CPU a cycle.
    print(
        f"bench: 1-minute load average {load:.2f} before the side-by-side runs, "
        f"{os.getloadavg()[0]:.2f} after ({os.cpu_count()} CPUs)",
        flush=True,
    )


def report_side_by_side(ours: Side, go: Side) -> list[tuple[str, bool]]:
    """Prints the two drivers' figures and the ratios; returns issue Q21b's targets."""
    print(
        f"\nside by side: {ours.name} (dradriver) and {go.name} (tools/godriver, the "
        "kubeletplugin helper of k8s.io/dynamic-resource-allocation v0.34.4), one node, "
        "one API server, one client, interleaved blocks; ratio = dradriver / Go"
    )
    print(f"  {'':26}{'dradriver':>11}{'Go':>11}{'ratio':>8}")

    def row(label: str, a: float, b: float, fmt: Callable[[float], str]) -> None:
        print(f"  {label:26}{fmt(a):>11}{fmt(b):>11}{a / b:>7.2f}x")

    def rate(x: float) -> str:
        return f"{x:.0f}/s"

    for a, b in zip(ours.runs, go.runs, strict=True):
        print(f"  concurrency {a.workers} ({len(a.prepare)} cycles each)")
        row("  prepare p50", statistics.median(a.prepare), statistics.median(b.prepare), ms)
        row("  prepare p99", pct(a.prepare, 99), pct(b.prepare, 99), ms)
        row("  unprepare p50", statistics.median(a.unprepare), statistics.median(b.unprepare), ms)
        row("  unprepare p99", pct(a.unprepare, 99), pct(b.unprepare, 99), ms)
        row("  cycles/s", a.cycles_per_s, b.cycles_per_s, rate)
    row("RSS after the runs (MiB)", ours.rss, go.rss, lambda x: f"{x:.0f}")
    row("CPU s per 100 cycles", ours.cpu, go.cpu, lambda x: f"{x:.2f}")
    a, b = ours.runs[0], go.runs[0]  # concurrency 1
    prep = statistics.median(a.prepare) / statistics.median(b.prepare)
    unprep = statistics.median(a.unprepare) / statistics.median(b.unprepare)
    c16 = ours.runs[-1].cycles_per_s / go.runs[-1].cycles_per_s
    return [
        (f"concurrency 1: prepare p50 <= 1.10x Go's ({prep:.2f}x)", prep <= 1.10),
        (f"concurrency 1: unprepare p50 <= 1.25x Go's ({unprep:.2f}x)", unprep <= 1.25),
        (f"concurrency 16: cycles/s >= 0.9x Go's ({c16:.2f}x)", c16 >= 0.9),
        (f"RSS < 80 MiB ({ours.rss:.0f} MiB; Go {go.rss:.0f} MiB)", ours.rss < 80),
    ]


@dataclass
class FloorReport:
    """The plugin beside the floor, and its counted runs: the figures before Q21b's."""

    base: list[float]
    raw_gets: list[float]
    lib_gets: list[float]
    paired: Run
    runs: list[Run]
    starts: dict[str, float]
    rss: float
    parts: dict[str, float]
    plugin_cpu: float
    control_cpu: float
    quiet_cpu: float
    requests: Counter[str]


def against_floor(
    work: Path,
    kube: Kube,
    kubeconfig: str,
    control: tuple[int, int],
    dirs: tuple[Path, Path, Path],
    ns: str,
    claims: list[tuple[str, str]],
) -> FloorReport:
    """The plugin alone: with claim status off, then on, beside the floor; `dirs` are the
    kubelet's root, the state directory and the CDI directory."""
    root, state, cdi = dirs
    # A driver that writes no claim status: what the API server and etcd spend then.
    plugin = Plugin(work, kube, kubeconfig, root, state, "off", cdi)
    try:
        plugin.milestones(kube)
        sock = str(next((root / "plugins" / DRIVER).glob("dra*.sock")))
        c0 = cpu_seconds(*control)
        # The same runs as the counted ones below (this run was concurrency 1 alone
        # before): the API server's cost per cycle depends on the concurrency.
        quiet = [run_at(sock, ns, claims, w) for w in CONCURRENCY]
        time.sleep(2)  # what the run left for the API server to do
        quiet_cpu = (cpu_seconds(*control) - c0) / sum(len(r.prepare) for r in quiet) * 100
    finally:
        plugin.stop()

    plugin = Plugin(work, kube, kubeconfig, root, state, "on", cdi)
    try:
        starts = plugin.milestones(kube)
        sock = str(next((root / "plugins" / DRIVER).glob("dra*.sock")))
        raw = RawGet(kubeconfig)
        lib = Kube.from_kubeconfig(kubeconfig)
        probe = Floor(sock, raw, lib, ns, claims[0][0], state)
        for _ in range(30):  # warm: the connection, the page cache
            probe.sample()
        for samples in (probe.samples, probe.raw_gets, probe.lib_gets):
            samples.clear()
        # Latency against the floor first, the two interleaved; then the counted runs.
        paired = run_at(sock, ns, claims, 1, probe.sample)
        probe.close()
        lib.close()
        req0, p0, c0 = api_requests(kube), cpu_seconds(plugin.proc.pid), cpu_seconds(*control)
        runs = [run_at(sock, ns, claims, w) for w in CONCURRENCY]
        time.sleep(2)  # claim status is written in the background, coalesced
        cycles = sum(len(r.prepare) for r in runs)
        return FloorReport(
            base=probe.samples,
            raw_gets=probe.raw_gets,
            lib_gets=probe.lib_gets,
            paired=paired,
            runs=runs,
            starts=starts,
            rss=rss_mib(plugin.proc.pid),
            parts=rss_parts(plugin.proc.pid),
            plugin_cpu=(cpu_seconds(plugin.proc.pid) - p0) / cycles * 100,
            control_cpu=(cpu_seconds(*control) - c0) / cycles * 100,
            quiet_cpu=quiet_cpu,
            requests=api_requests(kube) - req0,
        )
    finally:
        plugin.stop()


def report_floor(f: FloorReport) -> list[tuple[str, bool]]:
    """Prints the figures against the floor; returns issue Q8's targets (item 5: the
    design's libraries on the wire may spend part of the hand-written stack's lead)."""
    base, paired, runs, starts = f.base, f.paired, f.runs, f.starts
    cycles = sum(len(r.prepare) for r in runs)
    total = cycles + len(paired.prepare)
    f50, f99 = statistics.median(base), pct(base, 99)
    p50, p99 = statistics.median(paired.prepare), pct(paired.prepare, 99)
    u50, u99 = statistics.median(paired.unprepare), pct(paired.unprepare, 99)
    print()
    print(
        "floor (gRPC round trip + raw claim GET + fsync'd 1 KiB write, one before each "
        "concurrency-1 cycle): "
        f"p50 {ms(f50)}, p99 {ms(f99)}"
    )
    print(
        f"concurrency  1 between floor samples: prepare p50 {ms(p50)} p99 {ms(p99)} "
        f"({p50 / f50:.2f}x / {p99 / f99:.2f}x the floor's), unprepare p50 {ms(u50)} p99 {ms(u99)}"
    )
    # What the prepare ratio would be were the floor's GET the plugin's own (the issue's
    # floor keeps http.client's): each sample with its raw GET's time swapped for the
    # plugin client's GET taken right after it.
    raw50, lib50 = statistics.median(f.raw_gets), statistics.median(f.lib_gets)
    swapped = [b - r + k for b, r, k in zip(base, f.raw_gets, f.lib_gets, strict=True)]
    s50 = statistics.median(swapped)
    print(
        f"  (not a target) the floor's GET p50 {ms(raw50)} with http.client, {ms(lib50)} "
        f"with the plugin's client (urllib3, JSON decoded; {ms(lib50 - raw50)} more); "
        f"with that GET the floor's p50 is {ms(s50)} and prepare {p50 / s50:.2f}x it"
    )
    for r in runs:
        print(
            f"concurrency {r.workers:2d}: prepare p50 {ms(statistics.median(r.prepare))} "
            f"p99 {ms(pct(r.prepare, 99))}, unprepare p50 {ms(statistics.median(r.unprepare))} "
            f"p99 {ms(pct(r.unprepare, 99))}, {r.cycles_per_s:.0f} cycles/s"
        )
    for k, v in starts.items():
        print(f"start to {k}: {v:.3f} s")
    print(
        f"plugin RSS after {total} cycles: {f.rss:.0f} MiB ("
        + ", ".join(f"{k} {v:.1f}" for k, v in f.parts.items())
        + ")"
    )
    print(
        f"CPU per 100 cycles: plugin {f.plugin_cpu:.2f} s, API server + etcd "
        f"{f.control_cpu:.2f} s ({f.quiet_cpu:.2f} s with claim status off)"
    )
    print(
        "API requests per cycle: "
        + ", ".join(f"{k} {v / cycles:.2f}" for k, v in sorted(f.requests.items()) if v)
    )
    c16 = runs[-1].cycles_per_s
    growing = all(a.cycles_per_s < b.cycles_per_s for a, b in itertools.pairwise(runs))
    writes = sum(v for k, v in f.requests.items() if not k.startswith(("GET", "LIST", "WATCH")))
    return [
        (f"prepare p50 <= 1.15x floor ({p50 / f50:.2f}x)", p50 <= 1.15 * f50),
        (f"prepare p99 <= 2x floor p99 ({p99 / f99:.2f}x)", p99 <= 2 * f99),
        (f"unprepare p50 <= 2 ms ({ms(u50)}; p99 {ms(u99)})", u50 <= 0.002),
        (f"concurrency 16 >= 300 cycles/s ({c16:.0f}/s)", c16 >= 300),
        ("cycles/s grow from concurrency 1 to 4 to 16", growing),
        (
            f"start to registration socket <= 0.3 s ({starts['registration socket']:.3f} s)",
            starts["registration socket"] <= 0.3,
        ),
        (
            f"start to first slice <= 1.0 s ({starts['first ResourceSlice']:.3f} s)",
            starts["first ResourceSlice"] <= 1.0,
        ),
        (f"RSS < 100 MiB after {total} cycles ({f.rss:.0f} MiB)", f.rss < 100),
        (f"no API write per cycle ({writes / cycles:.2f})", writes / cycles < 0.01),
    ]


def print_targets(issue: str, targets: list[tuple[str, bool]]) -> None:
    print(f"\n{issue}'s targets:")
    for text, met in targets:
        print(f"  [{'met' if met else 'NOT met'}] {text}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--claims", type=int, default=1000, help="claims per run (of each driver)")
    ap.add_argument(
        "--cdi-on",
        choices=("tmpfs", "disk"),
        default="tmpfs",
        help="where the CDI specs go: a tmpfs, as /var/run/cdi is on a node (the default), "
        "or the disk under the work directory (the layout of runs before 2026-12-01's "
        "seventh session)",
    )
    ap.add_argument(
        "--peer-only",
        action="store_true",
        help="only the side-by-side runs with the Go driver (not the floor's, Q8's)",
    )
    args = ap.parse_args()
    compileall.compile_dir(REPO / "dradriver", quiet=2, workers=0)
    compileall.compile_dir(REPO / "fakenvml", quiet=2, workers=0)
    go_binary = godriver_binary()
    work = Path(tempfile.mkdtemp(prefix="drbench-"))
    print(f"bench: control plane in {work}", flush=True)
    st = cluster.up(work / "cluster", controllers="*,-resourceclaim-controller")
    kube = Kube.from_kubeconfig(st.kubeconfig)
    control = (st.pids["kube-apiserver"], st.pids["etcd"])
    root, state = work / "kubelet", work / "state"
    cdi = cdi_dir(args.cdi_on, work)
    print(f"bench: CDI specs in {cdi}", flush=True)
    kubelet = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dradriver.cli",
            "dev",
            "kubelet",
            "--node",
            NODE,
            "--root",
            str(root),
            "--kubeconfig",
            st.kubeconfig,
        ],
        stdout=open(work / "kubelet.log", "wb"),  # noqa: SIM115 - the child keeps it
        stderr=subprocess.STDOUT,
    )
    plugin: Plugin | None = None
    peer: GoDriver | None = None
    floor: FloorReport | None = None
    try:
        wait_node_ready(kube, kubelet, work)
        ns = "bench"
        kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
        print(f"bench: creating {args.claims} allocated claims for each driver", flush=True)
        claims = make_claims(kube, ns, args.claims)
        # The cluster has dradriver's DeviceClass; the Go driver's, and its claims.
        kube.create(
            path_for(RES, "deviceclasses"),
            {
                "metadata": {"name": GO_DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{GO_DRIVER}'"}}]},
            },
        )
        go_names = [f"gpu-{i}" for i in range(GPUS)]  # tools/godriver's names
        go_claims = make_claims(kube, ns, args.claims, GO_DRIVER, go_names)
        if not args.peer_only:
            floor = against_floor(
                work, kube, st.kubeconfig, control, (root, state, cdi), ns, claims
            )

        # Both drivers started afresh (RSS after the same cycles), dradriver first: its
        # start deletes the node's slices.
        print("bench: dradriver and the Go driver side by side", flush=True)
        plugin = Plugin(work, kube, st.kubeconfig, root, state, "on", cdi)
        plugin.milestones(kube)
        peer = GoDriver(go_binary, work, st.kubeconfig, root, cdi)
        peer.wait_ready(kube)
        ours = Side(
            DRIVER,
            str(next((root / "plugins" / DRIVER).glob("dra*.sock"))),
            claims,
            plugin.proc.pid,
        )
        go = Side(GO_DRIVER, str(peer.sock), go_claims, peer.proc.pid)
        side_by_side([ours, go], ns)
    finally:
        for proc in (plugin, peer):
            if proc is not None:
                proc.stop()
        kubelet.terminate()
        kubelet.wait(10)
        cluster.down(work / "cluster")
        if not cdi.is_relative_to(work):  # a tmpfs keeps what is not removed
            shutil.rmtree(cdi, ignore_errors=True)
    # Its logs are kept when the run fails (above, raised past this); a run that
    # measured has nothing left to read in them.
    shutil.rmtree(work, ignore_errors=True)

    q8 = report_floor(floor) if floor is not None else []
    q21b = report_side_by_side(ours, go)
    if q8:
        print_targets("Q8", q8)
    print_targets("Q21b", q21b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
