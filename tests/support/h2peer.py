"""Hostile HTTP/2 peers for a gRPC server on a Unix socket: the attacks the kubelet
plugin's DRA socket must survive, each in its own process so that the attacker's CPU
and memory are never the server's or its victim's.

    python -m tests.support.h2peer <attack> <socket> [options]

prints one JSON line: what was sent, how long it took, and what the server answered
(GOAWAY with its code and when, RST_STREAM codes, gRPC statuses). Every loop is bounded
by a count, a deadline or a socket timeout, so an attack ends even against a server
that never answers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hyperframe import frame as hf

from dradriver.api import kubelet as kapi
from tests.support import hpack_literal
from tests.support.h2wire import (
    CANCEL,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    PREFACE,
    Peer,
    error_name,
    grpc_message,
    request_headers,
)

_DRA = kapi.dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
PREPARE = f"/{_DRA}/NodePrepareResources"
# No flood goes on longer than this, however slowly the server reads.
SEND_BUDGET_S = 30.0


def prepare_request(claims: list[tuple[str, str, str]]) -> bytes:
    """A NodePrepareResourcesRequest for (namespace, uid, name) claims, serialized."""
    msgs = kapi.dra_v1
    req = msgs.NodePrepareResourcesRequest(
        claims=[msgs.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
    )
    return bytes(req.SerializeToString())


def claim_uid(i: int) -> str:
    """A well-formed UID per stream, so a handler that runs gets past the UID check and
    asks the API server for the claim (what the plugin does for any new claim)."""
    return str(uuid.UUID(int=(0xA77AC << 100) + i))


def _streams_summary(peer: Peer) -> dict[str, Any]:
    rst = Counter(error_name(s.rst) for s in peer.streams.values() if s.rst is not None)
    statuses = Counter(s.field("grpc-status") or "none" for s in peer.streams.values() if s.blocks)
    return {
        "answered_streams": sum(1 for s in peer.streams.values() if s.blocks),
        "grpc_status": dict(statuses),
        "rst_received": dict(rst),
    }


def _ending(peer: Peer, t0: float) -> dict[str, Any]:
    return {
        "goaway": peer.goaway_summary(t0),
        "closed_after_s": None if peer.closed_at is None else round(peer.closed_at - t0, 3),
        "hpack_errors": peer.hpack_errors,
    }


# -- the attacks -----------------------------------------------------------------------------


def rapid_reset(path: str, ns: str, name: str, streams: int, data: bool) -> dict[str, Any]:
    """`streams` requests on one connection, each reset (CANCEL) right after it is sent:
    HEADERS, the request DATA when `data` (what makes a handler's work real: the claim
    is a well-formed one the API server does not have), RST_STREAM. Frames go in batches
    of 100 streams; the DATA respects the connection window the server grants."""
    peer = Peer(path)
    peer.handshake()
    peer.pump(0.5)
    block = hpack_literal.encode(request_headers(PREPARE))
    batches: list[tuple[bytes, int]] = []
    for start in range(0, streams, 100):
        frames: list[hf.Frame] = []
        spent = 0
        for i in range(start, min(start + 100, streams)):
            sid = 2 * i + 1
            end = set() if data else {"END_STREAM"}
            frames.append(hf.HeadersFrame(sid, data=block, flags={"END_HEADERS", *end}))
            if data:
                body = grpc_message(prepare_request([(ns, claim_uid(i), name)]))
                frames.append(hf.DataFrame(sid, data=body, flags={"END_STREAM"}))
                spent += len(body)
            frames.append(hf.RstStreamFrame(sid, error_code=CANCEL))
        batches.append((b"".join(f.serialize() for f in frames), spent))
    t0 = time.monotonic()
    sent = frames_sent = 0
    stalled = False
    per_stream = 3 if data else 2
    for chunk, spent in batches:
        if time.monotonic() - t0 > SEND_BUDGET_S:
            break
        if not peer.wait(lambda spent=spent: peer.conn_window >= spent, 5.0):
            stalled = peer.closed_at is None
            break
        if not peer.send(chunk):
            break
        peer.conn_window -= spent
        n = min(100, streams - sent)
        sent += n
        frames_sent += n * per_stream
        peer.pump(0)
    send_s = time.monotonic() - t0
    peer.pump(1.0)
    peer.wait(lambda: False, 1.0)  # what the server still says about them
    out = {
        "attack": "rapid-reset",
        "streams_sent": sent,
        "frames_sent": frames_sent,
        "send_s": round(send_s, 3),
        "window_stalled": stalled,
        **_streams_summary(peer),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def continuation_flood(path: str, frames: int) -> dict[str, Any]:
    """HEADERS without END_HEADERS, then `frames` empty CONTINUATION frames that never end
    the block: a server must give up on the block (and the connection) early."""
    peer = Peer(path)
    peer.handshake()
    peer.pump(0.5)
    first = hpack_literal.encode(request_headers(PREPARE)[:1])
    peer.send(hf.HeadersFrame(1, data=first))  # no END_HEADERS: the block goes on
    one = hf.ContinuationFrame(1, data=b"").serialize()
    t0 = time.monotonic()
    sent = 0
    for _ in range(0, frames, 500):
        if time.monotonic() - t0 > SEND_BUDGET_S:
            break
        n = min(500, frames - sent)
        if not peer.send(one * n):
            break
        sent += n
        if not peer.pump(0):
            break
    send_s = time.monotonic() - t0
    peer.wait(lambda: False, 5.0)  # until it closes, or 5 s
    first_goaway = peer.goaways[0].at - t0 if peer.goaways else None
    out = {
        "attack": "continuation",
        "continuations_sent": sent,
        "send_s": round(send_s, 3),
        "goaway_after_s": None if first_goaway is None else round(first_goaway, 3),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def window_starved(path: str, ns: str, name: str, calls: int, hold: float) -> dict[str, Any]:
    """`calls` complete requests from a peer whose stream windows are 0 and that never
    sends WINDOW_UPDATE: no answer can be sent; the connection is held `hold` seconds."""
    peer = Peer(path, grant_window=False)
    peer.handshake({INITIAL_WINDOW_SIZE: 0})
    peer.pump(0.5)
    t0 = time.monotonic()
    frames: list[hf.Frame] = []
    for i in range(calls):
        sid = 2 * i + 1
        frames.append(peer.headers(sid, request_headers(PREPARE)))
        body = grpc_message(prepare_request([(ns, claim_uid(i), name)]))
        frames.append(hf.DataFrame(sid, data=body, flags={"END_STREAM"}))
    peer.send(*frames)
    peer.wait(lambda: peer.closed_at is not None, hold)
    out = {
        "attack": "window-starved",
        "calls": calls,
        "held_s": round(time.monotonic() - t0, 3),
        "data_bytes_received": sum(len(s.data) for s in peer.streams.values()),
        **_streams_summary(peer),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def idle_and_garbage(path: str, idle: int, garbage: int, hold: float) -> dict[str, Any]:
    """`idle` connections that send the preface and SETTINGS and then nothing, and
    `garbage` connections that send random bytes every 100 ms, all held `hold` seconds."""
    rng = random.Random(1)
    sel = selectors.DefaultSelector()
    opened = {"idle": 0, "garbage": 0}
    closed: dict[str, list[float]] = {"idle": [], "garbage": []}
    failed: Counter[str] = Counter()
    t0 = time.monotonic()
    socks: list[tuple[socket.socket, str]] = []
    connect_by = t0 + 10.0
    for kind, n in (("idle", idle), ("garbage", garbage)):
        for _ in range(n):
            s = _connect(path, connect_by, failed)
            if s is None:
                continue
            if kind == "idle":
                s.sendall(PREFACE + hf.SettingsFrame(0).serialize())
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, kind)
            socks.append((s, kind))
            opened[kind] += 1
    connect_s = time.monotonic() - t0
    live = {s for s, _ in socks}
    deadline = time.monotonic() + hold
    next_junk = 0.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_junk:
            next_junk = now + 0.1
            for s, kind in socks:
                if kind == "garbage" and s in live:
                    try:
                        s.send(rng.randbytes(1024))
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        _closed(sel, s, live, closed, kind, t0)
        for key, _ in sel.select(timeout=0.05):
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            try:
                if conn.recv(65536):
                    continue
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                pass
            _closed(sel, conn, live, closed, key.data, t0)
    for s, _ in socks:
        s.close()
    return {
        "attack": "idle-and-garbage",
        "opened": opened,
        "connect_failures": dict(failed),
        "connect_s": round(connect_s, 3),
        "closed_by_server": {k: len(v) for k, v in closed.items()},
        "garbage_closed_max_s": round(max(closed["garbage"], default=0.0), 3),
        "held_s": round(hold, 3),
    }


def _connect(path: str, by: float, failed: Counter[str]) -> socket.socket | None:
    """A connection, retried while the server's backlog is full (a Unix socket's connect
    then fails at once with EAGAIN) until `by`."""
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5.0)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() >= by:
                failed["backlog full"] += 1
                return None
            time.sleep(0.01)
        except OSError as exc:
            s.close()
            failed[type(exc).__name__] += 1
            return None


def _closed(
    sel: selectors.BaseSelector,
    s: socket.socket,
    live: set[socket.socket],
    closed: dict[str, list[float]],
    kind: str,
    t0: float,
) -> None:
    if s in live:
        live.discard(s)
        sel.unregister(s)
        closed[kind].append(time.monotonic() - t0)


def big_messages(
    path: str, ns: str, name: str, streams: int, size: int, max_s: float
) -> dict[str, Any]:
    """`streams` requests on one connection, each one gRPC message of `size` bytes (a
    NodePrepareResourcesRequest whose claim name fills it), sent as fast as the windows
    the server grants allow; a server that refuses a message stops its stream."""
    peer = Peer(path)
    peer.handshake()
    peer.pump(0.5)
    pad = max(size - 64, 1)
    payload = prepare_request([(ns, claim_uid(0), name + "x" * pad)])
    body = memoryview(grpc_message(payload))
    sids = [2 * i + 1 for i in range(streams)]
    offset = dict.fromkeys(sids, 0)
    t0 = time.monotonic()
    peer.send(*(peer.headers(sid, request_headers(PREPARE)) for sid in sids))
    deadline = t0 + max_s
    last_progress = t0
    stalled = False
    while time.monotonic() < deadline and peer.closed_at is None:
        moved = False
        for sid in sids:
            seen = peer.streams.get(sid)
            if offset[sid] >= len(body) or (seen is not None and seen.ended):
                continue
            n = min(peer.window_for(sid), peer.max_frame(), len(body) - offset[sid])
            if n <= 0:
                continue
            chunk = bytes(body[offset[sid] : offset[sid] + n])
            last = offset[sid] + n == len(body)
            flags = {"END_STREAM"} if last else set()
            if not peer.send(hf.DataFrame(sid, data=chunk, flags=flags)):
                break
            peer.spend(sid, n)
            offset[sid] += n
            moved = True
        if all(
            offset[s] >= len(body) or (peer.streams.get(s) and peer.streams[s].ended) for s in sids
        ):
            break
        if moved:
            last_progress = time.monotonic()
            peer.pump(0)
        elif time.monotonic() - last_progress > 3.0:
            stalled = True  # no window for 3 s: the server stopped reading us
            break
        else:
            peer.pump(0.05)
    send_s = time.monotonic() - t0
    peer.wait(lambda: all(s in peer.streams and peer.streams[s].ended for s in sids), 5.0)
    per_stream = []
    for sid in sids:
        seen = peer.streams.get(sid)
        per_stream.append(
            {
                "bytes_sent": offset[sid],
                "grpc_status": seen.field("grpc-status") if seen else None,
                "grpc_message": (seen.field("grpc-message") or "")[:200] if seen else None,
                "rst": error_name(seen.rst) if seen and seen.rst is not None else None,
            }
        )
    out = {
        "attack": "big-messages",
        "streams": streams,
        "message_bytes": len(body),
        "send_s": round(send_s, 3),
        "window_stalled": stalled,
        "per_stream": per_stream,
        **_streams_summary(peer),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def ping_flood(path: str, count: int) -> dict[str, Any]:
    """`count` PING frames on one connection, in batches of 100."""
    peer = Peer(path)
    peer.handshake()
    peer.pump(0.5)
    t0 = time.monotonic()
    sent = 0
    for start in range(0, count, 100):
        if time.monotonic() - t0 > SEND_BUDGET_S:
            break
        n = min(100, count - start)
        batch = b"".join(
            hf.PingFrame(0, opaque_data=(start + k).to_bytes(8, "big")).serialize()
            for k in range(n)
        )
        if not peer.send(batch):
            break
        sent += n
        if not peer.pump(0):
            break
    send_s = time.monotonic() - t0
    peer.wait(lambda: peer.ping_acks >= sent, 3.0)
    out = {
        "attack": "pings",
        "pings_sent": sent,
        "acks": peer.ping_acks,
        "send_s": round(send_s, 3),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def slow_pings(path: str, interval: float, seconds: float) -> dict[str, Any]:
    """A PING every `interval` seconds and nothing else for `seconds`: what a client with
    keepalive on and no calls sends; reports whether the server sent it away."""
    peer = Peer(path)
    peer.handshake()
    t0 = time.monotonic()
    sent = 0
    for k in range(int(seconds / interval) + 1):
        if not peer.send(hf.PingFrame(0, opaque_data=k.to_bytes(8, "big"))):
            break
        sent += 1
        next_at = t0 + (k + 1) * interval
        peer.wait(lambda: peer.closed_at is not None, max(0.0, next_at - time.monotonic()))
        if time.monotonic() - t0 >= seconds:
            break
    out = {
        "attack": "slow-pings",
        "pings_sent": sent,
        "acks": peer.ping_acks,
        **_ending(peer, t0),
    }
    peer.close()
    return out


def burst_at_connect(path: str, ns: str, uid: str, name: str, streams: int) -> dict[str, Any]:
    """`streams` whole calls sent the moment the connection opens, before the server's
    SETTINGS are read: what grpc-go's client (the kubelet's) may do, as it assumes 100
    concurrent streams until the server says its limit. Each asks for claim `uid`, which
    the plugin answers from its checkpoint. Reports how each stream ended."""
    peer = Peer(path)
    peer.handshake()
    body = grpc_message(prepare_request([(ns, uid, name)]))
    frames: list[hf.Frame] = []
    for i in range(streams):
        sid = 2 * i + 1
        frames.append(peer.headers(sid, request_headers(PREPARE)))
        frames.append(hf.DataFrame(sid, data=body, flags={"END_STREAM"}))
    t0 = time.monotonic()
    peer.send(*frames)
    peer.wait(
        lambda: sum(1 for s in peer.streams.values() if s.ended or s.rst is not None) >= streams,
        30.0,
    )
    out = {
        "attack": "burst-at-connect",
        "streams_sent": streams,
        "server_max_streams": peer.settings.get(MAX_CONCURRENT_STREAMS),
        "answered_s": round(time.monotonic() - t0, 3),
        **_streams_summary(peer),
        **_ending(peer, t0),
    }
    peer.close()
    return out


def in_flight_at_stop(
    path: str, ns: str, uid: str, name: str, ready_file: str, wait: float
) -> dict[str, Any]:
    """A call in flight when the server is told to stop: its request half sent, then
    `ready_file` is written (the caller then stops the server); once the GOAWAY comes
    the rest is sent and the answer awaited. Reports the GOAWAYs and the answer."""
    peer = Peer(path)
    peer.handshake()
    body = grpc_message(prepare_request([(ns, uid, name)]))
    half = len(body) // 2
    peer.send(peer.headers(1, request_headers(PREPARE)), hf.DataFrame(1, data=body[:half]))
    # The server has read the stream's opening once it answers a PING sent after it.
    peer.send(hf.PingFrame(0, opaque_data=b"inflight"))
    peer.wait(lambda: peer.ping_acks >= 1, 5.0)
    Path(ready_file).write_text("ready\n")
    t0 = time.monotonic()
    peer.wait(lambda: bool(peer.goaways), wait)
    rest_sent = bool(peer.goaways) and peer.send(
        hf.DataFrame(1, data=body[half:], flags={"END_STREAM"})
    )
    peer.wait(lambda: 1 in peer.streams and peer.streams[1].ended, 10.0)
    answered_at = time.monotonic()
    seen = peer.streams.get(1)
    answer = None
    if seen and len(seen.data) >= 5:
        resp = kapi.dra_v1.NodePrepareResourcesResponse.FromString(bytes(seen.data[5:]))
        answer = {u: {"error": c.error, "devices": len(c.devices)} for u, c in resp.claims.items()}
    peer.wait(lambda: False, max(0.0, t0 + wait - time.monotonic()))  # until it closes
    out = {
        "attack": "in-flight-at-stop",
        "rest_sent_after_goaway": rest_sent,
        "answered_after_s": round(answered_at - t0, 3) if seen and seen.ended else None,
        "grpc_status": seen.field("grpc-status") if seen else None,
        "grpc_message": seen.field("grpc-message") if seen else None,
        "rst": error_name(seen.rst) if seen and seen.rst is not None else None,
        "answer": answer,
        **_ending(peer, t0),
    }
    peer.close()
    return out


# -- the command line ------------------------------------------------------------------------


def _claim(text: str) -> tuple[str, str]:
    ns, _, name = text.partition("/")
    if not ns or not name:
        raise argparse.ArgumentTypeError("a claim is NAMESPACE/NAME")
    return ns, name


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.h2peer", description=__doc__)
    sub = ap.add_subparsers(dest="attack", required=True)

    def attack(name: str, fn: Callable[..., dict[str, Any]]) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("socket")
        p.set_defaults(fn=fn)
        return p

    p = attack(
        "rapid-reset",
        lambda a: rapid_reset(a.socket, a.claim[0], a.claim[1], a.streams, not a.no_data),
    )
    p.add_argument("--claim", type=_claim, default=("default", "rapid-reset"))
    p.add_argument("--streams", type=int, default=20000)
    p.add_argument("--no-data", action="store_true", help="HEADERS and RST_STREAM only")
    p = attack("continuation", lambda a: continuation_flood(a.socket, a.frames))
    p.add_argument("--frames", type=int, default=20000)
    p = attack(
        "window-starved",
        lambda a: window_starved(a.socket, a.claim[0], a.claim[1], a.calls, a.hold),
    )
    p.add_argument("--claim", type=_claim, default=("default", "starved"))
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--hold", type=float, default=15.0)
    p = attack("idle-and-garbage", lambda a: idle_and_garbage(a.socket, a.idle, a.garbage, a.hold))
    p.add_argument("--idle", type=int, default=500)
    p.add_argument("--garbage", type=int, default=100)
    p.add_argument("--hold", type=float, default=5.0)
    p = attack(
        "big-messages",
        lambda a: big_messages(a.socket, a.claim[0], a.claim[1], a.streams, a.size, a.max_seconds),
    )
    p.add_argument("--claim", type=_claim, default=("default", "big"))
    p.add_argument("--streams", type=int, default=6)
    p.add_argument("--size", type=_size, default=15 << 20)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p = attack("pings", lambda a: ping_flood(a.socket, a.count))
    p.add_argument("--count", type=int, default=10000)
    p = attack("slow-pings", lambda a: slow_pings(a.socket, a.interval, a.seconds))
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p = attack(
        "burst-at-connect",
        lambda a: burst_at_connect(a.socket, a.ns, a.uid, a.name, a.streams),
    )
    p.add_argument("--ns", required=True)
    p.add_argument("--uid", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--streams", type=int, default=100)
    p = attack(
        "in-flight-at-stop",
        lambda a: in_flight_at_stop(a.socket, a.ns, a.uid, a.name, a.ready_file, a.wait),
    )
    p.add_argument("--ns", required=True)
    p.add_argument("--uid", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--wait", type=float, default=50.0)

    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        out = args.fn(args)
    except OSError as exc:  # connecting failed, or a send timed out: say so, as JSON
        out = {"attack": args.attack, "error": f"{type(exc).__name__}: {exc}"}
    out["wall_s"] = round(time.monotonic() - t0, 3)
    out["pid"] = os.getpid()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
