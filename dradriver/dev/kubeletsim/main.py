"""`dradriver dev kubelet`: wiring of the simulator's loops."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dradriver import logs
from dradriver.k8s import Kube, KubeError, path_for

from .cdi import default_resolver
from .events import EventRecorder
from .node import NodeAgent
from .plugins import PluginRegistry
from .pods import PodSyncer
from .state import ClaimState

log = logs.get_logger("kubeletsim")
BACKOFF_MAX = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", required=True, help="node name to simulate")
    p.add_argument(
        "--root",
        required=True,
        help="kubelet root directory (plugins_registry/, plugins/ and pods/ go here)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig to use (default: $KUBECONFIG, then in-cluster config)",
    )
    p.add_argument(
        "--cdi-dir",
        action="append",
        default=None,
        help="CDI spec directory to resolve devices from; repeatable (default: <root>/cdi)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Node label; repeatable",
    )
    p.add_argument(
        "--slice-wipe-delay",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="delete a driver's ResourceSlices once none of its plugin instances "
        "has been reachable for this long (the kubelet uses 30s)",
    )
    p.add_argument(
        "--python-cdi",
        action="store_true",
        help="resolve CDI devices in Python even when the reference Go tool is built",
    )
    p.add_argument("--log-level", default="info")


class Simulator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "plugins").mkdir(exist_ok=True)
        self.cdi_dirs = [Path(d).resolve() for d in (args.cdi_dir or [self.root / "cdi"])]
        for d in self.cdi_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.kube = Kube.from_kubeconfig(args.kubeconfig)
        labels = dict(kv.split("=", 1) for kv in args.label)
        self.node = NodeAgent(self.kube, args.node, labels)
        self.plugins = PluginRegistry(
            self.root / "plugins_registry",
            on_driver_gone=self._driver_gone,
            wipe_after=args.slice_wipe_delay,
        )
        self.claims = ClaimState(self.root / "dra_manager_state.json")
        self.syncer = PodSyncer(
            self.kube,
            args.node,
            self.root,
            self.plugins,
            self.claims,
            default_resolver(prefer_reference=not args.python_cdi),
            self.cdi_dirs,
            EventRecorder(self.kube, args.node),
        )
        self.stop = threading.Event()
        self._cv = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()
        self._due: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._inflight: set[str] = set()

    # -- loops -----------------------------------------------------------------------------
    def _driver_gone(self, driver: str) -> None:
        try:
            self.node.delete_slices(driver)
        except KubeError as exc:
            log.warning("deleting slices failed", driver=driver, error=exc.message)

    def _plugin_loop(self) -> None:
        last_probe = 0.0
        while not self.stop.wait(0.2):
            try:
                self.plugins.scan()
                if time.monotonic() - last_probe >= 1.0:
                    last_probe = time.monotonic()
                    self.plugins.check_reachability()
                    self._write_status()
            except Exception:
                log.error("plugin watcher pass failed", exc=True)

    def _write_status(self) -> None:
        status = {
            "node": self.node.name,
            "drivers": self.plugins.registered_drivers(),
            "preparedClaims": sorted(c.uid for c in self.claims.snapshot()),
        }
        tmp = self.root / ".status.json.tmp"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.root / "status.json")

    def _mark(self, uid: str, delay: float = 0.0) -> None:
        with self._cv:
            self._due[uid] = time.monotonic() + delay
            self._cv.notify()

    def _watch_loop(self) -> None:
        path = path_for("v1", "pods")
        selector = f"spec.nodeName={self.node.name}"
        while not self.stop.is_set():
            try:
                listing = self.kube.list(path, fieldSelector=selector)
                current = {p["metadata"]["uid"]: p for p in listing.get("items", [])}
                with self._cv:
                    for uid in set(self._pods) - set(current):
                        self._gone.add(uid)
                    self._pods = current
                    # Claims held for pods that vanished while we were not looking.
                    for c in self.claims.snapshot():
                        for uid in c.pods - set(current):
                            self._gone.add(uid)
                for uid in set(current) | self._gone:
                    self._mark(uid)
                rv = listing["metadata"].get("resourceVersion")
                for ev in self.kube.watch(
                    path, resource_version=rv, timeout_seconds=30, fieldSelector=selector
                ):
                    if self.stop.is_set():
                        return
                    obj = ev.get("object", {})
                    if ev["type"] == "BOOKMARK":
                        continue
                    uid = obj["metadata"]["uid"]
                    with self._cv:
                        if ev["type"] == "DELETED":
                            self._pods.pop(uid, None)
                            self._gone.add(uid)
                        else:
                            self._pods[uid] = obj
                    self._mark(uid)
            except KubeError as exc:
                log.warning("pod watch failed; re-listing", error=exc.message)
                self.stop.wait(1.0)
            except Exception:
                log.error("pod watch crashed; re-listing", exc=True)
                self.stop.wait(1.0)

    def _sync(self, uid: str) -> None:
        with self._cv:
            pod = self._pods.get(uid)
            gone = uid in self._gone and pod is None
        try:
            if gone or (pod is not None and pod["metadata"].get("deletionTimestamp")):
                done = self.syncer.stop(uid, pod)
                if done and gone:
                    with self._cv:
                        self._gone.discard(uid)
            elif pod is not None:
                done = self.syncer.start(pod)
            else:
                done = True
        except Exception:
            log.error("pod sync crashed", pod_uid=uid, exc=True)
            done = False
        with self._cv:
            self._inflight.discard(uid)
            if done:
                self._failures.pop(uid, None)
            else:
                n = self._failures[uid] = self._failures.get(uid, 0) + 1
                self._due[uid] = time.monotonic() + min(BACKOFF_MAX, 0.5 * 2 ** (n - 1))
            self._cv.notify()

    def _work_loop(self, pool: ThreadPoolExecutor) -> None:
        while not self.stop.is_set():
            with self._cv:
                now = time.monotonic()
                ready = [u for u, t in self._due.items() if t <= now and u not in self._inflight]
                for uid in ready:
                    del self._due[uid]
                    self._inflight.add(uid)
                if not ready:
                    nxt = min(self._due.values(), default=now + 1.0)
                    self._cv.wait(timeout=max(0.02, min(1.0, nxt - now)))
                    continue
            for uid in ready:
                pool.submit(self._sync, uid)

    def run(self) -> int:
        self.node.ensure()
        # A starting kubelet does not trust slices published for its node before it ran.
        self.node.delete_slices()
        log.info(
            "kubelet simulator running",
            node=self.node.name,
            root=str(self.root),
            cdi_dirs=",".join(map(str, self.cdi_dirs)),
            cdi_resolver=type(self.syncer.resolver).__name__,
        )
        threads = [
            threading.Thread(
                target=self.node.heartbeat_loop, args=(self.stop,), name="heartbeat", daemon=True
            ),
            threading.Thread(target=self._plugin_loop, name="plugins", daemon=True),
            threading.Thread(target=self._watch_loop, name="pods", daemon=True),
        ]
        for t in threads:
            t.start()
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="sync") as pool:
            self._work_loop(pool)
        self.plugins.close()
        log.info("kubelet simulator stopped", node=self.node.name)
        return 0


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    sim = Simulator(args)

    def _stop(signum: int, _frame: object) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        sim.stop.set()
        with sim._cv:
            sim._cv.notify_all()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return sim.run()
