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

CLAIMS = path_for("resource.k8s.io/v1", "resourceclaims")
# How often a claim waiting for its domain's other nodes looks at the domain again.
RECHECK = 1.0
IDLE = 30.0
# Failures that pass by themselves: reported as a wait, tried again.
TRANSIENT = frozenset({WAITING, "imex_api"})


def _camel(reason: str) -> str:
    """imex_not_ready -> IMEXNotReady: a condition reason is CamelCase."""
    words = reason.split("_")
    return "".join(w.upper() if w in ("imex", "api", "cdi", "mig") else w.title() for w in words)


class Binder:
    def __init__(
        self,
        kube: Kube,
        driver: str,
        node: str,
        *,
        steps: ImexSteps,
        lock: AbstractContextManager[Any],
        prepared: Callable[[], set[str]],
    ) -> None:
        self.kube, self.driver, self.node, self.steps = kube, driver, node, steps
        # The node lock, and the claims the checkpoint holds (read under it).
        self.lock, self.prepared = lock, prepared
        self.field_manager = f"{driver}/binding"
        self._wake = threading.Event()
        self.mirror = Mirror(kube, CLAIMS, self._wake.set, labelSelector=cd.DOMAIN_LABEL)
        self.passes = 0

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
        self.passes += 1
        if not self.mirror.synced.is_set():
            return True
        claims = self.mirror.items()
        busy = False
        candidates = plan.waiting(claims, self.driver, self.node, prepared=set())
        if candidates:
            with self.lock:
                prepared = self.prepared()
            for w in candidates:
                if w.ref.uid not in prepared:
                    busy = self._bind(w) or busy
        self._sweep(claims)
        return busy

    def _sweep(self, claims: list[plan.Obj]) -> None:
        if not self.steps.configs():
            return
        with self.lock:
            keep = self.prepared() | plan.allocated_here(claims, self.driver, self.node)
            for uid in plan.to_sweep(self.steps.configs(), keep):
                log.info(
                    "stopping the IMEX daemon of a claim no longer allocated here", claim_uid=uid
                )
                self.steps.undo_forgotten(uid)

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
        (pd,) = channels
        try:
            dev = channel_device(
                ref,
                self.driver,
                self.node,
                request=pd.request,
                device=pd.device,
                configs=pd.configs,
            )
            assert dev.imex is not None
            im = dev.imex
            self.steps.prebind(ref.uid, str(ref), im)
        except ImexError as exc:
            if exc.reason in TRANSIENT:
                said = plan.condition(
                    cd.BINDING_CONDITION,
                    False,
                    "WaitingForNodes" if exc.reason == WAITING else "APIUnreachable",
                    message=f"IMEX layer: {exc}",
                    now=_now(),
                )
                if not plan.unchanged(w.said, said):
                    self._write(ref, [said])
                return True
            self._failed(w, exc)
            return False
        except DriverError as exc:  # a config or claim the channel cannot be given for
            self._failed(w, exc)
            return False
        domain = f"{im.namespace}/{im.domain}"
        log.info(
            "IMEX daemon ready before binding",
            claim=str(ref),
            claim_uid=ref.uid,
            domain=domain,
        )
        self._write(
            ref,
            [
                plan.condition(
                    cd.BINDING_CONDITION,
                    True,
                    "IMEXDaemonReady",
                    message=f"this node's IMEX daemon for ComputeDomain {domain} is ready "
                    f"(peers: {', '.join(im.peers)})",
                    now=_now(),
                )
            ],
        )
        return False

    def _failed(self, w: plan.Waiting, exc: DriverError) -> None:
        message = f"{exc.layer} layer: {exc}"
        log.warning(
            "binding failed: the scheduler places the pod again",
            claim=str(w.ref),
            claim_uid=w.ref.uid,
            reason=exc.reason,
            error=str(exc),
        )
        now = _now()
        reason = _camel(exc.reason)
        self._write(
            w.ref,
            [
                plan.condition(cd.BINDING_CONDITION, False, reason, message=message, now=now),
                plan.condition(cd.BINDING_FAILURE, True, reason, message=message, now=now),
            ],
        )

    def _write(self, ref: Any, conds: list[plan.Obj]) -> None:
        try:
            self.kube.apply(
                path_for(
                    "resource.k8s.io/v1",
                    "resourceclaims",
                    ref.namespace,
                    name=ref.name,
                    subresource="status",
                ),
                plan.status_body(ref, self.driver, self.node, conds=conds),
                field_manager=self.field_manager,
            )
        except NotFound:
            pass  # the claim is gone; the sweep stops its daemon
        except KubeError as exc:
            log.warning(
                "binding condition not written",
                claim=str(ref),
                claim_uid=ref.uid,
                error=exc.message,
            )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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
