"""Keeps the ValidatingWebhookConfiguration trusting our CA and carrying our failure policy.

Every webhook of the named configuration gets our CA in `clientConfig.caBundle` and the
configured `failurePolicy`, by a JSON patch guarded by the resourceVersion it was
computed from. The CAs already in a bundle are kept, ours first, up to MAX_CAS and none
expired: during a rolling update the old pod, with its own CA, still answers until it
stops, and replacing the bundle outright would make the API server reject it meanwhile.
A dead pod's CA left in a bundle is harmless, its key died with the pod.

The configuration is watched, so a `helm upgrade` that writes an empty caBundle back is
repaired within a moment; until the object exists we retry.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from dradriver import logs
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.mirror import resource_version, resumable

log = logs.get_logger("controller.cabundle")
API = "admissionregistration.k8s.io/v1"
PLURAL = "validatingwebhookconfigurations"
MAX_CAS = 4


def _certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []  # an unreadable bundle trusts nothing; ours replaces it


def merged_bundle(existing_b64: str, ours_pem: bytes, now: dt.datetime) -> str | None:
    """The base64 caBundle with our CA in it, or None when it already has it."""
    try:
        existing = base64.b64decode(existing_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        existing = b""
    ours = x509.load_pem_x509_certificate(ours_pem)
    others = []
    for cert in _certs(existing):
        if cert == ours:
            return None
        if cert.not_valid_after_utc > now:
            others.append(cert.public_bytes(Encoding.PEM))
    bundle = ours_pem + b"".join(others[: MAX_CAS - 1])
    return base64.b64encode(bundle).decode()


def patch_ops(
    config: dict[str, Any], ours_pem: bytes, failure_policy: str | None, *, now: dt.datetime
) -> list[dict[str, Any]]:
    """The JSON patch that makes every webhook trust our CA and use `failure_policy`
    (None leaves it alone); [] when nothing needs changing."""
    ops: list[dict[str, Any]] = []
    for i, wh in enumerate(config.get("webhooks") or []):
        bundle = merged_bundle((wh.get("clientConfig") or {}).get("caBundle", ""), ours_pem, now)
        if bundle is not None:
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            )
        if failure_policy is not None and wh.get("failurePolicy") != failure_policy:
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/failurePolicy", "value": failure_policy}
            )
    if ops:
        # Computed from this version, the patch fits this version only: webhooks added,
        # removed or reordered meanwhile would shift the indices.
        rv = (config.get("metadata") or {}).get("resourceVersion", "")
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    return ops


class CaBundleSyncer:
    def __init__(
        self,
        kube: Kube,
        name: str,
        ca_pem: Callable[[], bytes],
        *,
        failure_policy: str | None,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.kube, self.name, self.ca_pem = kube, name, ca_pem
        self.failure_policy, self.clock = failure_policy, clock
        self.path = path_for(API, PLURAL, name=name)
        self.patched = threading.Event()
        self.last_error = f"validatingwebhookconfiguration {name} not seen yet"
        self._waiting_logged = False

    def sync(self, config: dict[str, Any]) -> None:
        ops = patch_ops(config, self.ca_pem(), self.failure_policy, now=self.clock())
        if ops:
            self.kube.patch(self.path, ops, "json")
            log.info(
                "webhook configuration patched",
                webhook_config=self.name,
                webhooks=len(config.get("webhooks") or []),
                failure_policy=self.failure_policy,
            )
        elif not config.get("webhooks"):
            log.warning("webhook configuration has no webhooks", webhook_config=self.name)
        if not self.patched.is_set():
            log.info("webhook configuration trusts our CA", webhook_config=self.name)
        self.patched.set()
        self.last_error = ""

    def run(self, stop: threading.Event) -> None:
        """Lists the one object by name and watches it, so its creation is seen at once.
        A watch that ends or breaks goes on from the last resourceVersion seen; the object
        is listed again only when that version is gone or a patch was refused (it moved
        on: what to patch is computed again from what it is now)."""
        backoff = 1.0
        selector = f"metadata.name={self.name}"
        rv: str | None = None  # where the next watch starts; None: list first
        while not stop.is_set():
            try:
                if rv is None:
                    rv = self._list(selector)
                started, events = time.monotonic(), 0
                for event in self.kube.watch(
                    path_for(API, PLURAL), resource_version=rv, fieldSelector=selector
                ):
                    if stop.is_set():
                        return
                    events += 1
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        try:
                            self.sync(event["object"])
                        except KubeError:
                            rv = None  # the patch was refused: list, and compute it anew
                            raise
                    rv = resource_version(event) or rv
                backoff = 1.0
                # The server ended the watch; a pause only if it ends every one at once.
                if not events and time.monotonic() - started < 1.0:
                    stop.wait(1.0)
                continue
            except KubeError as exc:
                if rv is not None and not resumable(exc):
                    rv = None
                self.last_error = f"{self.name}: {exc.message}"
                log.warning(
                    "syncing the webhook configuration failed; retrying",
                    webhook_config=self.name,
                    error=exc.message,
                    then="list" if rv is None else "watch",
                    retry_in=f"{backoff:.0f}s",
                )
            except Exception as exc:
                # Never let this thread die quietly: readiness would stay false for good.
                rv = None
                self.last_error = f"{self.name}: {exc}"
                log.error("webhook configuration sync failed; retrying", exc=True, error=str(exc))
            stop.wait(backoff)
            backoff = min(30.0, backoff * 2)

    def _list(self, selector: str) -> str | None:
        """Lists the object and syncs it; returns the resourceVersion to watch from."""
        listed = self.kube.list(path_for(API, PLURAL), fieldSelector=selector)
        for config in listed.get("items") or []:
            self.sync(config)
        if not listed.get("items"):
            self.last_error = f"validatingwebhookconfiguration {self.name} not found"
            if not self._waiting_logged:
                log.info("waiting for the webhook configuration", webhook_config=self.name)
                self._waiting_logged = True
        rv = (listed.get("metadata") or {}).get("resourceVersion")
        return str(rv) if rv else None
