"""What a hollow node (the real v1.34 kubelet, `dradriver dev kubelet`) costs, so the test
bed is known to fit the machine: two nodes with a plugin each beside the control plane,
memory and CPU at idle and while 100 GPU pods run through one of them.

    .venv/bin/python benchmarks/hollow_node.py [--pods 100] [--idle 30]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver.k8s import Conflict, Kube, NotFound, path_for  # noqa: E402
from dradriver_dev import cluster  # noqa: E402
from dradriver_dev.driver_files import plugin_env  # noqa: E402

RES = "resource.k8s.io/v1"
NODES = {"bench-a": "fake:8xH100-80GB", "bench-b": "fake:4xA100-80GB:nvlink=pairs+2xL4"}
TICK = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


class Sampler:
    """Peak RSS of some processes, sampled every 0.5 s while running."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids, self.peak = pids, dict.fromkeys(pids, 0.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mib(pid))

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def wait(what: str, fn: Any, timeout: float = 120) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if v := fn():
                return v
        except NotFound:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def node_ready(kube: Kube, name: str) -> bool:
    conds = kube.get(path_for("v1", "nodes", name=name)).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def run_pods(kube: Kube, ns: str, node: str, total: int) -> None:
    """`total` pods with one GPU each, in waves of 8 (the node's GPUs), each wave
    created, running, deleted and gone before the next."""
    kube.create(
        path_for(RES, "resourceclaimtemplates", ns),
        {
            "metadata": {"name": "one"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
                        ]
                    }
                }
            },
        },
    )
    for wave in range(0, total, 8):
        names = [f"p{i}" for i in range(wave, min(wave + 8, total))]
        for name in names:
            kube.create(
                path_for("v1", "pods", ns),
                {
                    "metadata": {"name": name},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                },
            )
        for name in names:
            p = path_for("v1", "pods", ns, name=name)
            wait(f"pod {name} running", lambda p=p: kube.get(p)["status"].get("phase") == "Running")
        for name in names:
            kube.delete(path_for("v1", "pods", ns, name=name))
        for name in names:
            p = path_for("v1", "pods", ns, name=name)
            wait(f"pod {name} gone", lambda p=p: _gone(kube, p))


def _gone(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
        return False
    except NotFound:
        return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="drnode-"))
    print(f"bench: control plane and nodes in {work}", flush=True)
    st = cluster.up(work / "cluster")
    kube = Kube.from_kubeconfig(st.kubeconfig)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for doc in _device_classes():
            with contextlib.suppress(Conflict):
                kube.create(path_for(RES, "deviceclasses"), doc)
        for name, devices in NODES.items():
            root = work / name
            root.mkdir()
            log = open(work / f"{name}-kubelet.log", "wb")  # noqa: SIM115 - the child keeps it
            procs[f"kubelet {name}"] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dradriver.cli", "dev", "kubelet", "--node", name),
                    *("--root", str(root), "--kubeconfig", st.kubeconfig),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            wait(f"node {name}", lambda n=name: node_ready(kube, n))
            log = open(work / f"{name}-plugin.log", "wb")  # noqa: SIM115
            procs[f"plugin {name}"] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dradriver.cli", "kubelet-plugin", "--node-name", name),
                    *("--devices", devices, "--kubeconfig", st.kubeconfig),
                    *("--kubelet-dir", str(root), "--cdi-dir", str(root / "cdi")),
                    *("--state-dir", str(work / f"{name}-state"), "--healthz-port", "0"),
                    *("--log-level", "warning"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=plugin_env(),  # the driver's files in CDI, as the plugin's default
            )
        for name in NODES:
            wait(
                f"slices of {name}",
                lambda n=name: kube.list(
                    path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={n}"
                )["items"],
            )
        pids = {k: p.pid for k, p in procs.items()}
        pids.update({k: v for k, v in st.pids.items()})
        time.sleep(5)  # let start-up settle before measuring idle
        c0 = {k: cpu_s(p) for k, p in pids.items()}
        time.sleep(args.idle)
        idle_cpu = {k: (cpu_s(p) - c0[k]) / args.idle * 100 for k, p in pids.items()}
        idle_rss = {k: rss_mib(p) for k, p in pids.items()}

        ns = "bench"
        kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
        wait(
            "the namespace's ServiceAccount",
            lambda: kube.get(path_for("v1", "serviceaccounts", ns, name="default")),
        )
        c1 = {k: cpu_s(p) for k, p in pids.items()}
        t1 = time.monotonic()
        with Sampler(pids) as sampler:
            run_pods(kube, ns, "bench-a", args.pods)
        wall = time.monotonic() - t1
        load_cpu = {k: (cpu_s(p) - c1[k]) / wall * 100 for k, p in pids.items()}

        print()
        print(
            f"{args.pods} one-GPU pods through bench-a in {wall:.1f} s "
            f"({args.pods / wall:.1f} pods/s, waves of 8)"
        )
        print(f"{'process':34} {'idle RSS':>9} {'idle CPU':>9} {'peak RSS':>9} {'CPU in run':>11}")
        for k in pids:
            print(
                f"{k:34} {idle_rss[k]:7.0f} MiB {idle_cpu[k]:7.1f} % "
                f"{sampler.peak[k]:7.0f} MiB {load_cpu[k]:9.1f} %"
            )
        total = sum(sampler.peak.values())
        print(
            f"{'all of the above (peak RSS sum)':34} {total:.0f} MiB of 24 GiB "
            "(CPU % is of one core)"
        )
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.down(work / "cluster")
    return 0


def _device_classes() -> list[dict[str, Any]]:
    import yaml

    return [
        d for d in yaml.safe_load_all((REPO / "deploy" / "deviceclasses.yaml").read_text()) if d
    ]


if __name__ == "__main__":
    sys.exit(main())
