"""What `dradriver fleet` costs once the lists are read (issue Q13: "fast on 500
nodes"): the report over N nodes of 8 NVLinked H100s, two 3-GPU claims on each and a
few Pending claims, against its floor measured in the same run, build_world (what
`dradriver explain` spends reading the same lists into typed records). The LISTs
themselves are the API server's (one per kind, as for explain).

    .venv/bin/python benchmarks/fleet_report.py [--nodes 100,500] [--pending 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver.diagnose.fleet import fleet  # noqa: E402
from dradriver.diagnose.fleet_claims import pending_requests  # noqa: E402
from dradriver.diagnose.world import build_world  # noqa: E402
from tests.unit.diagnose.test_explain import CLASSES, node, slices  # noqa: E402
from tests.unit.diagnose.test_fleet import claim, gpu_names, pending_pod  # noqa: E402


def lists(n: int, pending: int) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    one = slices("n", "8xH100-80GB")
    names = gpu_names(one)
    all_slices, claims, nodes = [], [], []
    for i in range(n):
        name = f"n{i:03d}"
        for s in one:  # the same devices under each node's name: building 500 is slow
            copy = {
                **s,
                "spec": {
                    **s["spec"],
                    "nodeName": name,
                    "pool": {**s["spec"]["pool"], "name": name},
                },
            }
            all_slices.append(copy)
        nodes.append(node(name))
        claims += [
            claim(f"{name}-a", 3, (name, names[0:3])),
            claim(f"{name}-b", 3, (name, names[3:6])),
        ]
    pods = []
    for j in range(pending):
        claims.append(claim(f"wide-{j}", 4 + j % 2))
        pods.append(pending_pod(f"wide-{j}", f"wide-{j}"))
    return all_slices, claims, nodes, pods


def best(f: Any, rounds: int = 5) -> float:
    took = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def measure(n: int, pending: int, classes: dict[str, Any]) -> None:
    s, c, nodes, pods = lists(n, pending)
    floor = best(lambda: build_world(s, CLASSES, c, nodes=nodes))

    def report() -> Any:
        reqs, _ = pending_requests(pods, c, classes)
        return fleet(build_world(s, CLASSES, c, nodes=nodes), reqs)

    took = best(report)
    r = report()
    print(
        f"{n:>6} {8 * n:>6} {floor * 1000:>10.0f}ms {took * 1000:>8.0f}ms "
        f"{took / floor:>5.1f}x {r.stranded_gpus:>9}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--nodes", default="100,500")
    ap.add_argument("--pending", type=int, default=3)
    args = ap.parse_args()
    classes = {c["metadata"]["name"]: c for c in CLASSES}
    print(
        f"{'nodes':>6} {'GPUs':>6} {'build_world':>12} {'fleet':>10} {'ratio':>6} {'stranded':>9}"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        measure(n, args.pending, classes)


if __name__ == "__main__":
    main()
