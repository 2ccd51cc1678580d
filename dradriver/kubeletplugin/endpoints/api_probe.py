"""API reachability for /readyz (ApiProbe), and the one-line cause of a failed probe."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field

from dradriver.k8s import Kube, KubeError

# The probe asks what the plugin itself needs (its node's slices), not /version: every
# identity, even an anonymous one, may read /version, so a missing RBAC grant would pass.
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slices_query(node: str, driver: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}", "limit": "1"}


def describe(host: str, exc: KubeError) -> str:
    """Why the probe failed, worded so the reader (and `dradriver doctor`) can tell the
    plugin's credentials, its RBAC and the network apart."""
    said = f"{exc.status} {exc.reason}: {exc.message}"
    if exc.status == 401:
        return f"the API server at {host} refused the plugin's credentials ({said})"
    if exc.status == 403:
        return f"the API server at {host} forbids the plugin's identity to list its slices ({said})"
    if exc.status == 0 and exc.reason == "NoCredentials":
        return f"the plugin has no credentials for the API server at {host} ({exc.message})"
    if exc.status == 0:
        return f"cannot reach the API server at {host} ({exc.message})"
    return f"the API server at {host} answers {said}"


@dataclass(eq=False)
class ApiProbe:
    """API reachability for /readyz. The first probe runs from start(), and check()
    waits for it (at most `timeout`), so the first answer is a result, never a guess;
    after that a check older than `ttl` seconds starts the next probe in the background
    and answers with the last result meanwhile, so /readyz answers at once even while the
    API server hangs (it then says for how long the probe has waited), and the API server
    is asked no more often than something asks /readyz (the kubelet's readiness probe)."""

    kube: Kube
    path: str = "/version"
    query: Mapping[str, str] = field(default_factory=dict)
    _: KW_ONLY
    ttl: float = 5.0
    timeout: float = 3.0
    _result: tuple[bool, str] | None = field(default=None, init=False)
    _at: float = field(default=float("-inf"), init=False)  # when the last result came
    _since: float | None = field(default=None, init=False)  # when the probe in flight started
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False)

    def start(self) -> None:
        """Starts a probe, unless one is under way or the last result is younger than
        `ttl` (the first call always starts one)."""
        with self._cond:
            now = time.monotonic()
            if self._since is not None or now - self._at <= self.ttl:
                return
            self._since = now
        threading.Thread(target=self.probe_once, name="api-probe", daemon=True).start()

    def check(self) -> tuple[bool, str]:
        self.start()
        with self._cond:
            if self._result is None and self._since is not None:
                # None left (the probe is past its timeout): wait_for returns at once.
                left = self._since + self.timeout - time.monotonic()
                self._cond.wait_for(lambda: self._result is not None, left)
            waited = time.monotonic() - self._since if self._since is not None else 0.0
            if self._result is None or waited > self.timeout:
                host = self.kube.host
                return False, f"the API server at {host} is not answering for {waited:.0f} s"
            return self._result

    def probe_once(self) -> None:
        try:
            self.kube.get(self.path, timeout=self.timeout, **self.query)
            result = (True, self.kube.host)
        except KubeError as exc:
            result = (False, describe(self.kube.host, exc))
        with self._cond:
            self._result, self._at, self._since = result, time.monotonic(), None
            self._cond.notify_all()
