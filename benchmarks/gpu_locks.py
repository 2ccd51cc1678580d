"""What a slow MIG carve on one GPU costs prepares on the others (issue Q6, item 3: per-GPU
locking). In process, over 4 fake H100s in dynamic MIG mode with the checkpoint on this
disk, the same Preparer the plugin runs (no gRPC, no API server: claims are handed in):

- quiet: prepare + unprepare cycles of partitions on GPUs 1-3, one after another;
- beside a carve: the same cycles while a carve on GPU 0 is held for --carve seconds (a
  real nvmlGpuInstanceCreate takes a noticeable fraction of a second; the fake's takes
  microseconds, so the bench holds it);
- the ratio of the two p50s: 1.0x when GPU 0's carve holds nobody up. With one node lock
  around the hardware work (before per-GPU locks) every cycle waited for the carve.

    .venv/bin/python benchmarks/gpu_locks.py [--cycles 200] [--carve 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dradriver import logs  # noqa: E402
from dradriver.kubeletplugin.prepare.plan import ClaimRef  # noqa: E402
from tests.support.gpu_names import names_of  # noqa: E402
from tests.support.node import allocated_claim, fake_preparer  # noqa: E402

PROFILES = ["1g10gb-0", "2g20gb-2", "3g40gb-4", "7g80gb-0"]


def cycles(driver: Any, claims: dict[str, Any], n: int, tag: str) -> list[float]:
    took = []
    gpus = names_of(driver.devices())  # the node's GPU names, by NVML index
    for i in range(n):
        name = f"{tag}-{i}"
        claims[name] = allocated_claim(name, f"{gpus[1 + i % 3]}-mig-{PROFILES[i % 4]}")
        ref = ClaimRef("team", claims[name]["metadata"]["uid"], name)
        t0 = time.perf_counter()
        r = driver.prepare([ref])[ref.uid]
        if r.error or driver.unprepare([ref])[ref.uid]:
            raise SystemExit(f"cycle {name} failed: {r.error}")
        took.append(time.perf_counter() - t0)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--carve", type=float, default=0.3, help="seconds GPU 0's carve is held")
    args = ap.parse_args()
    logs.setup("warning")
    with tempfile.TemporaryDirectory(prefix="dradriver-bench-locks-") as tmp:
        claims: dict[str, Any] = {}
        driver, _ = fake_preparer(Path(tmp), "4xH100-80GB", lambda ref: claims[ref.name])
        carver = driver.executor.mig.carver
        gpu0 = next(d.gpu.uuid for d in driver.devices().values() if d.gpu.index == 0)
        real, held = carver.create, threading.Event()

        def create(gpu: str, *rest: Any, **named: Any) -> Any:
            if gpu == gpu0:
                held.set()
                time.sleep(args.carve)
            return real(gpu, *rest, **named)

        carver.create = create
        cycles(driver, claims, 20, "warm")
        quiet = cycles(driver, claims, args.cycles, "quiet")

        stop = threading.Event()
        whole0 = f"{names_of(driver.devices())[0]}-mig-7g80gb-0"

        def carve_gpu0() -> None:
            i = 0
            while not stop.is_set():
                name = f"slow-{i}"
                claims[name] = allocated_claim(name, whole0)
                ref = ClaimRef("team", claims[name]["metadata"]["uid"], name)
                driver.prepare([ref])
                driver.unprepare([ref])
                i += 1

        slow = threading.Thread(target=carve_gpu0, daemon=True)
        slow.start()
        held.wait(5)
        beside = cycles(driver, claims, args.cycles, "beside")
        stop.set()
        slow.join(args.carve * 4 + 5)

    q, b = statistics.median(quiet), statistics.median(beside)
    q99, b99 = (statistics.quantiles(x, n=100)[98] for x in (quiet, beside))
    print(f"prepare+unprepare of a partition on GPUs 1-3, {args.cycles} cycles each:")
    print(f"  quiet:                      p50 {q * 1e3:.2f} ms  p99 {q99 * 1e3:.2f} ms")
    print(
        f"  beside a {args.carve:.1f} s carve on GPU 0: p50 {b * 1e3:.2f} ms  "
        f"p99 {b99 * 1e3:.2f} ms  ({b / q:.2f}x quiet)"
    )
    print(
        "  (with the node lock around the hardware work, as before per-GPU locks, a cycle "
        f"that came during the carve waited for it: up to {args.carve * 1e3:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
