"""Prepare + unprepare latency and throughput of the kubelet plugin, next to a floor.

Runs the real plugin process (fake GPUs) against the real local control plane and calls
it over its real Unix socket the way the kubelet does; the plugin reads every claim from
the API server. The floor, measured in the same run on the same machine, is what one
prepare cannot avoid: a bare gRPC round trip on the same socket, one GET of the same
claim, and one fsync'd write of a checkpoint-sized file.

    .venv/bin/python benchmarks/prepare.py [--claims 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver.api import kubelet as kapi  # noqa: E402
from dradriver.k8s import Kube, NotFound, path_for  # noqa: E402
from dradriver_dev import cluster  # noqa: E402

RES = "resource.k8s.io/v1"
DRIVER = "gpu.dradriver.io"
NODE = "bench-node"
GPUS = 64


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def make_claims(kube: Kube, ns: str, n: int, workers: int) -> list[tuple[str, str]]:
    """Claims allocated and reserved by hand: scheduling is not what is measured here.
    (The cluster runs without the resourceclaim controller, which would otherwise drop
    reservations for pods that do not exist.)"""
    out = []
    for i in range(n):
        gpu = (i % workers) + workers * ((i // workers) % (GPUS // workers))
        c = kube.create(
            path_for(RES, "resourceclaims", ns),
            {
                "metadata": {"name": f"c{i}"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
                        ]
                    }
                },
            },
        )
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{gpu}"}
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": f"p{i}", "uid": f"00000000-0000-0000-0000-{i:012d}"}
            ],
        }
        kube.replace(path_for(RES, "resourceclaims", ns, f"c{i}", "status"), c)
        out.append((f"c{i}", c["metadata"]["uid"]))
    return out


def cycle(stub: Any, ns: str, name: str, uid: str) -> float:
    m = kapi.dra_v1
    claim = m.Claim(namespace=ns, uid=uid, name=name)
    t = time.perf_counter()
    r = stub.NodePrepareResources(m.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
    if r.claims[uid].error:
        raise RuntimeError(r.claims[uid].error)
    u = stub.NodeUnprepareResources(m.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45)
    if u.claims[uid].error:
        raise RuntimeError(u.claims[uid].error)
    return time.perf_counter() - t


def run_at(
    sock: str, ns: str, claims: list[tuple[str, str]], workers: int
) -> tuple[list[float], float]:
    lat: list[float] = []
    lock = threading.Lock()
    chunks = [claims[w::workers] for w in range(workers)]

    def worker(chunk: list[tuple[str, str]]) -> None:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
            for name, uid in chunk:
                d = cycle(stub, ns, name, uid)
                with lock:
                    lat.append(d)

    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, chunks))
    return lat, time.perf_counter() - t


def floor(sock: str, kube: Kube, ns: str, name: str, state: Path, n: int = 200) -> list[float]:
    m = kapi.dra_v1
    payload = b"x" * 1024
    out = []
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        for _ in range(n):
            t = time.perf_counter()
            stub.NodeUnprepareResources(m.NodeUnprepareResourcesRequest(), timeout=10)
            kube.get(path_for(RES, "resourceclaims", ns, name))
            tmp = state / "floor.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, payload)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, state / "floor")
            out.append(time.perf_counter() - t)
    return out


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--claims", type=int, default=1000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="drbench-"))
    print(f"bench: control plane in {work}", flush=True)
    st = cluster.up(work / "cluster", controllers="*,-resourceclaim-controller")
    kube = Kube.from_kubeconfig(st.kubeconfig)
    root, state = work / "kubelet", work / "state"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The real kubelet (a hollow node) registers the plugin, as on a node.
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
        procs.append(kubelet)
        wait_node_ready(kube, kubelet, work)
        port = 18000 + os.getpid() % 1000
        t0 = time.perf_counter()
        plugin = subprocess.Popen(
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
                st.kubeconfig,
                "--kubelet-dir",
                str(root),
                "--cdi-dir",
                str(root / "cdi"),
                "--state-dir",
                str(state),
                "--healthz-address",
                "127.0.0.1",
                "--healthz-port",
                str(port),
                "--log-level",
                "warning",
            ],
            stdout=open(work / "plugin.log", "wb"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT,
        )
        procs.append(plugin)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > 60:
                raise RuntimeError("plugin not ready in 60s; see " + str(work / "plugin.log"))
            time.sleep(0.02)
        startup = time.perf_counter() - t0
        sock = str(next((root / "plugins" / DRIVER).glob("dra*.sock")))
        ns = "bench"
        kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
        print(f"bench: creating {args.claims} allocated claims", flush=True)
        claims = make_claims(kube, ns, args.claims, 16)
        base = floor(sock, kube, ns, claims[0][0], state)
        rows = []
        for workers in (1, 16):
            cycle_lat, wall = run_at(sock, ns, claims, workers)
            rows.append((workers, cycle_lat, wall))
        rss = rss_mib(plugin.pid)
        f50 = statistics.median(base)
        print()
        print(
            f"floor (gRPC round trip + claim GET + fsync'd 1 KiB write): p50 {ms(f50)}, "
            f"p99 {ms(pct(base, 99))}"
        )
        print("prepare+unprepare per claim (one cycle = two gRPC calls):")
        for workers, lat, wall in rows:
            p50, p99 = statistics.median(lat), pct(lat, 99)
            print(
                f"  concurrency {workers:2d}: p50 {ms(p50)}, p99 {ms(p99)}, "
                f"{len(lat) / wall:.0f} claims/s, p50/floor {p50 / f50:.1f}x"
            )
        print(f"startup to ready (registered, slices published): {startup:.2f} s")
        print(f"plugin RSS after {2 * args.claims} cycles: {rss:.0f} MiB")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.down(work / "cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
