"""API reachability for /readyz (ApiProbe)."""

from __future__ import annotations

import threading
import time

from dradriver.k8s import Kube, KubeError


class ApiProbe:
    """API reachability for /readyz: probed in the background, every `ttl` seconds at most,
    so /readyz answers at once even while the API server hangs (it then says for how long
    the probe has waited)."""

    def __init__(self, kube: Kube, ttl: float = 5.0, timeout: float = 3.0) -> None:
        self.kube, self.ttl, self.timeout = kube, ttl, timeout
        self._at = float("-inf")
        self._result = (False, "not checked yet")
        self._since: float | None = None  # when the probe in flight started
        self._lock = threading.Lock()

    def check(self) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            if self._since is None and now - self._at > self.ttl:
                self._since = now
                threading.Thread(target=self._probe, name="api-probe", daemon=True).start()
            if self._since is not None and now - self._since > self.timeout:
                return False, f"API server not answering for {now - self._since:.0f} s"
            return self._result

    def _probe(self) -> None:
        try:
            self.kube.get("/version", timeout=self.timeout)
            result = (True, self.kube.host)
        except KubeError as exc:
            result = (False, f"API server unreachable: {exc.message}")
        with self._lock:
            self._result, self._at, self._since = result, time.monotonic(), None
