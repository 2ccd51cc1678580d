"""A well-behaved client of the DRA socket in its own process, with grpcio's client (the
reference gRPC implementation), to measure what an attack on the server costs others.

    python -m tests.support.victim prepare <socket> --claim NS/NAME/UID ... [--seconds N]
    python -m tests.support.victim keepalive <socket> --claim NS/NAME/UID [--seconds N]

`prepare`: one channel, as the kubelet keeps one, starting a NodePrepareResources call
every 50 ms (answered or not) with a 3 s deadline, until --seconds pass or SIGTERM/SIGINT
(--ready-file is written once the first call is over); prints one JSON line:
calls, failures by status code, p50/p99/max latency, what each claim was answered, the
slowest calls (offset from start, seconds, status), and when the first failed call
started (offset from start; `started_at` is the start on the wall clock).

`keepalive`: a channel that pings every 2 s (grpc.keepalive_time_ms=2000, without calls
too), calling at the start and at the end only, so that most of its life has no call
in flight, as the kubelet's connection mostly has none; prints whether the connection
was ever lost (connectivity left READY) and how the calls went.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from dradriver.api import kubelet as kapi


def _claims(specs: list[str]) -> Any:
    msgs = kapi.dra_v1
    out = []
    for spec in specs:
        ns, name, uid = spec.split("/", 2)
        out.append(msgs.Claim(namespace=ns, name=name, uid=uid))
    return msgs.NodePrepareResourcesRequest(claims=out)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def prepare(
    sock: str, claims: list[str], seconds: float, every: float, deadline: float, ready: str
) -> Any:
    req = _claims(claims)
    names = {c.uid: c.name for c in req.claims}
    stop = _stop_on_signals()
    lock = threading.Lock()
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    first_failure: dict[str, str] = {}
    # Per claim: how many answers carried devices, and the errors (first text, count).
    answers: dict[str, Counter[str]] = {n: Counter() for n in names.values()}
    slow: list[tuple[float, float, str]] = []
    failed_at: list[float] = []  # when each failed call started, seconds from t0
    done = threading.Semaphore(0)
    t0 = time.monotonic()
    started_at = time.time()  # t0 on the wall clock, for the caller's own events

    def finished(fut: Any, start: float) -> None:
        took = time.monotonic() - start
        code, detail = "OK", ""
        try:
            resp = fut.result()
        except grpc.RpcError as exc:
            code = exc.code().name if exc.code() else "UNKNOWN"
            detail = str(exc.details())
        with lock:
            if code == "OK":
                for uid, name in names.items():
                    c = resp.claims[uid]
                    answers[name]["error: " + c.error[:80] if c.error else "devices"] += 1
            else:
                failures[code] += 1
                first_failure.setdefault(code, detail[:300])
                failed_at.append(round(start - t0, 3))
            latencies.append(took)
            slow.append((round(start - t0, 3), round(took, 3), code))
            slow.sort(key=lambda s: -s[1])
            del slow[10:]
            if ready and len(latencies) == 1:
                Path(ready).write_text("calling\n")
        done.release()

    started = 0
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        # A call every 50 ms whether or not the earlier ones are answered, as the
        # kubelet's pod workers call independently: a stalled server shows as many
        # failed calls, not as one slow one.
        while not stop.is_set() and time.monotonic() - t0 < seconds:
            start = time.monotonic()
            fut = stub.NodePrepareResources.future(req, timeout=deadline)
            fut.add_done_callback(functools.partial(finished, start=start))
            started += 1
            stop.wait(max(0.0, t0 + started * every - time.monotonic()))
        # The last calls get their deadline, and a second more.
        for _ in range(started):
            if not done.acquire(timeout=deadline + 1.0):
                break
    with lock:
        lat = sorted(latencies) or [0.0]
        return {
            "mode": "prepare",
            "calls": started,
            "answered": len(latencies),
            "failures": sum(failures.values()) + started - len(latencies),
            "by_code": dict(failures),
            "first_failure": first_failure,
            "p50_s": round(statistics.median(lat), 4),
            "p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 4),
            "max_s": round(lat[-1], 4),
            "answers": {n: dict(c) for n, c in answers.items()},
            "slowest": slow,
            "first_failed_at_s": min(failed_at, default=None),
            "started_at": started_at,
            "ran_s": round(time.monotonic() - t0, 3),
        }


def keepalive(sock: str, claims: list[str], seconds: float, ping_every_ms: int) -> Any:
    req = _claims(claims)
    stop = _stop_on_signals()
    options = [
        ("grpc.keepalive_time_ms", ping_every_ms),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        # grpcio's client stops pinging after 2 pings without data (the default of this
        # setting); grpc-go's, the kubelet's, pings on for as long as keepalive is on.
        ("grpc.http2.max_pings_without_data", 0),
    ]
    states: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def seen(state: grpc.ChannelConnectivity) -> None:
        states.append((round(time.monotonic() - t0, 3), state.name))

    calls: list[tuple[float, str]] = []
    with grpc.insecure_channel(f"unix://{sock}", options=options) as ch:
        ch.subscribe(seen, try_to_connect=True)
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)

        def call() -> None:
            at = round(time.monotonic() - t0, 3)
            try:
                stub.NodePrepareResources(req, timeout=3)
                calls.append((at, "OK"))
            except grpc.RpcError as exc:
                calls.append((at, exc.code().name if exc.code() else "UNKNOWN"))

        call()
        stop.wait(max(0.0, seconds - 1.0))
        call()
        ch.unsubscribe(seen)
    names = [s for _, s in states]
    ready_at = names.index("READY") if "READY" in names else None
    lost = ready_at is not None and any(s != "READY" for s in names[ready_at + 1 :])
    return {
        "mode": "keepalive",
        "seconds": round(time.monotonic() - t0, 3),
        "connectivity": states,
        "ever_ready": ready_at is not None,
        "lost_connection": lost,
        "calls": calls,
        "failures": sum(1 for _, c in calls if c != "OK"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.victim", description=__doc__)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("socket")
    p.add_argument("--claim", action="append", required=True, help="NAMESPACE/NAME/UID")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--every", type=float, default=0.05)
    p.add_argument("--deadline", type=float, default=3.0)
    p.add_argument("--ready-file", default="", help="written once the first call is over")
    k = sub.add_parser("keepalive")
    k.add_argument("socket")
    k.add_argument("--claim", action="append", required=True, help="NAMESPACE/NAME/UID")
    k.add_argument("--seconds", type=float, default=20.0)
    k.add_argument("--ping-every-ms", type=int, default=2000)
    a = ap.parse_args(argv)
    if a.mode == "prepare":
        out = prepare(a.socket, a.claim, a.seconds, a.every, a.deadline, a.ready_file)
    else:
        out = keepalive(a.socket, a.claim, a.seconds, a.ping_every_ms)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
