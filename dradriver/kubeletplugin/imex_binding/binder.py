"""The binder: for each claim made from a ComputeDomain template that holds this node's
channel device while the scheduler waits on its binding conditions, starts the domain's
IMEX daemon here and says how it went in the claim's status.devices entry; and stops the
daemons nobody holds any more. See docs/design.md, "IMEX channels and daemons".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.errors import ClaimStateError, DriverError, ImexError
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.k8s.mirror import Mirror
from dradriver.kubeletplugin.hardware.imex import WAITING, ImexSteps
from dradriver.kubeletplugin.imex_binding import plan
from dradriver.kubeletplugin.prepare.channels import channel_device, is_channel
from dradriver.kubeletplugin.prepare.claim_devices import claim_devices
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.imex_binding")

API = "resource.k8s.io/v1"
# How often a claim waiting for its domain's other nodes looks at the domain again.
RECHECK = 1.0
IDLE = 30.0
# Failures that pass by themselves: reported as a wait (with this reason), tried again.
TRANSIENT = {WAITING: "WaitingForNodes", "imex_api": "APIUnreachable"}


def _camel(reason: str) -> str:
    """imex_not_ready -> IMEXNotReady: a condition reason is CamelCase."""
    words = reason.split("_")
    return "".join(w.upper() if w in ("imex", "api", "cdi", "mig") else w.title() for w in words)


@dataclass
class Binder:
    kube: Kube
    driver: str
    node: str
    _: KW_ONLY
    steps: ImexSteps
    lock: AbstractContextManager[Any]  # the node lock
    prepared: Callable[[], set[str]]  # the claims the checkpoint holds (read under the lock)

    def __post_init__(self) -> None:
        self._wake = threading.Event()
        claims = path_for(API, "resourceclaims")
        self.mirror = Mirror(self.kube, claims, self._wake.set, labelSelector=cd.DOMAIN_LABEL)

    def run(self, stop: threading.Event) -> None:
        threading.Thread(
            target=self.mirror.run, args=(stop,), name="binding-claims", daemon=True
        ).start()
        while not stop.is_set():
            busy = False
            try:
                busy = self.step()
            except Exception as exc:  # the loop outlives any one claim's trouble
                log.error("binding pass failed", error=str(exc))
            self._wake.wait(RECHECK if busy else IDLE)
            self._wake.clear()

    def step(self) -> bool:
        """One pass; whether a claim is still waiting."""
        if not self.mirror.synced.is_set():
            return True
        claims = self.mirror.items()
        busy = False
        if candidates := plan.waiting(claims, self.driver, self.node, prepared=set()):
            with self.lock:
                prepared = self.prepared()
            for w in [c for c in candidates if c.ref.uid not in prepared]:
                busy = self._bind(w) or busy
        if self.steps.configs():  # the sweep: daemons whose claim is neither prepared nor here
            with self.lock:
                keep = self.prepared() | plan.allocated_here(claims, self.driver, self.node)
                for uid in plan.to_sweep(self.steps.configs(), keep):
                    log.info(
                        "stopping the IMEX daemon of a claim no longer allocated here",
                        claim_uid=uid,
                    )
                    self.steps.undo_forgotten(uid)
        return busy

    def _bind(self, w: plan.Waiting) -> bool:
        """Whether the claim still waits."""
        ref = w.ref
        try:
            devices = claim_devices(w.claim, ref, self.driver, pool=self.node)
        except ClaimStateError:
            return True  # not reserved for its pod yet, or replaced: the watch says more
        channels = [d for d in devices.devices if is_channel(d.device)]
        if len(channels) != 1:
            return False  # plan.waiting found exactly this one; a second is not ours
        (c,) = channels
        try:
            im = channel_device(
                ref, self.driver, self.node, request=c.request, device=c.device, configs=c.configs
            ).imex
            assert im is not None
            self.steps.prebind(ref.uid, str(ref), im)
        except DriverError as exc:  # also a config or claim the channel cannot be given for
            if isinstance(exc, ImexError) and exc.reason in TRANSIENT:
                self._say(w, TRANSIENT[exc.reason], f"IMEX layer: {exc}")
                return True
            log.warning(
                "binding failed: the scheduler places the pod again",
                claim=str(ref),
                claim_uid=ref.uid,
                reason=exc.reason,
                error=str(exc),
            )
            self._say(w, _camel(exc.reason), f"{exc.layer} layer: {exc}", failed=True)
            return False
        domain = f"{im.namespace}/{im.domain}"
        log.info(
            "IMEX daemon ready before binding", claim=str(ref), claim_uid=ref.uid, domain=domain
        )
        peers = ", ".join(im.peers)
        message = f"this node's IMEX daemon for ComputeDomain {domain} is ready (peers: {peers})"
        self._say(w, "IMEXDaemonReady", message, ready=True)
        return False

    def _say(
        self, w: plan.Waiting, reason: str, said: str, *, ready: bool = False, failed: bool = False
    ) -> None:
        """The channel's binding condition, and its failure condition where `failed`, in the
        claim's status; a False one only when it says something new."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conds = [plan.condition(cd.BINDING_CONDITION, ready, reason, message=said, now=now)]
        if failed:
            conds.append(plan.condition(cd.BINDING_FAILURE, True, reason, message=said, now=now))
        elif plan.unchanged(w.said, conds[0]):
            return
        ref = w.ref
        path = path_for(API, "resourceclaims", ref.namespace, name=ref.name, subresource="status")
        body = plan.status_body(ref, self.driver, self.node, conds=conds)
        try:
            self.kube.apply(path, body, field_manager=f"{self.driver}/binding")
        except NotFound:
            pass  # the claim is gone; the sweep stops its daemon
        except KubeError as exc:
            log.warning(
                "binding condition not written",
                claim=str(ref),
                claim_uid=ref.uid,
                error=exc.message,
            )


def start(
    mode: str,
    kube: Kube,
    driver: str,
    *,
    node: str,
    steps: ImexSteps,
    lock: AbstractContextManager[Any],
    prepared: Callable[[], set[str]],
    stop: threading.Event,
) -> Binder | None:
    """--imex-binding-conditions: the binder running, or None where the channel device
    is published without binding conditions (prepare waits for the domain instead)."""
    from dradriver.kubeletplugin.imex_binding.probe import api_keeps_binding_conditions

    if mode == "off":
        return None
    if mode == "auto" and not api_keeps_binding_conditions(kube, driver, node):
        log.info(
            "IMEX channels without binding conditions: the API server drops them (alpha "
            "gates DRADeviceBindingConditions, DRAResourceClaimDeviceStatus off); prepare "
            "waits for each ComputeDomain instead"
        )
        return None
    binder = Binder(kube, driver, node, steps=steps, lock=lock, prepared=prepared)
    threading.Thread(target=binder.run, args=(stop,), name="binding", daemon=True).start()
    log.info("IMEX channels with binding conditions: pods are bound once their daemon is ready")
    return binder
