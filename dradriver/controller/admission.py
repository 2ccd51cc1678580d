"""AdmissionReview (admission.k8s.io/v1) in, a decision, AdmissionReview out. Pure.

A refusal carries `status.code: 422` with `reason: Invalid`, the code and reason the API
server gives for its own field validation: the object is well formed but its content is
wrong, and retrying the same object cannot succeed. The API server passes the status
through and prefixes the message with the webhook's name; kubectl then prints
`The request is invalid: error when creating "claim.yaml": admission webhook "..."
denied the request: ResourceClaim "x": spec.devices.config[0]...: <what fits>`. No
`details` are set on purpose: with causes kubectl prints only the causes, dropping both
the file and the webhook's name, which are what tell a user where the refusal came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.api import depth
from dradriver.api.echo import echo
from dradriver.controller.validate import DEVICES_PATH, Problem, devices_of, object_problems

API_VERSION = "admission.k8s.io/v1"
GROUP = "resource.k8s.io"
CHECKED_OPERATIONS = ("CREATE", "UPDATE")


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer (no uid to answer with)."""


@dataclass(frozen=True)
class Request:
    uid: str
    group: str
    kind: str
    operation: str
    namespace: str
    name: str
    object: dict[str, Any]
    old_object: dict[str, Any] | None

    @property
    def display_name(self) -> str:
        """The object's name as a user knows it; generateName objects have none yet."""
        if self.name:
            return f'{self.kind} "{self.name}"'
        generate = (self.object.get("metadata") or {}).get("generateName")
        return f'{self.kind} with generateName "{generate}"' if generate else self.kind

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Decision:
    allowed: bool
    problems: tuple[Problem, ...] = ()
    unchecked: str = ""  # why nothing was checked, for the log


def parse(body: bytes) -> Request:
    try:
        review = depth.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadReview(f"body nests deeper than {depth.MAX_PARSE_DEPTH} levels") from None
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
            f"{echo(review.get('apiVersion'))} {echo(review.get('kind'))} "
            "(set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    req = review.get("request")
    if not isinstance(req, dict):
        raise BadReview("request: missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid: missing or not a string")
    gvk = req.get("kind")
    if not isinstance(gvk, dict):
        raise BadReview("request.kind: missing or not an object")
    operation = str(req.get("operation", ""))
    obj, old = req.get("object"), req.get("oldObject")
    if operation in CHECKED_OPERATIONS and not isinstance(obj, dict):
        raise BadReview(f"request.object: missing or not an object on {operation}")
    return Request(
        uid=uid,
        group=str(gvk.get("group", "")),
        kind=str(gvk.get("kind", "")),
        operation=operation,
        namespace=str(req.get("namespace") or ""),
        name=str(req.get("name") or ""),
        object=obj if isinstance(obj, dict) else {},
        old_object=old if isinstance(old, dict) else None,
    )


def decide(req: Request, driver: str) -> Decision:
    if req.group != GROUP or req.kind not in DEVICES_PATH:
        # Only the webhook configuration's rules decide what is sent here; refusing what
        # we do not understand would block unrelated objects when those rules are wrong.
        return Decision(True, unchecked=f"{req.group}/{req.kind} is not checked here")
    if req.operation not in CHECKED_OPERATIONS:
        return Decision(True, unchecked=f"operation {req.operation} is not checked")
    # Before anything walks it recursively (the comparison below, validation, messages).
    deep = depth.too_deep(req.object, depth.OBJECT_DEPTH)
    if deep is not None:
        return Decision(False, (Problem(deep, depth.nesting_message(deep, depth.OBJECT_DEPTH)),))
    if req.old_object is not None and devices_of(req.kind, req.object) == devices_of(
        req.kind, req.old_object
    ):
        # Metadata and status writes (finalizers, labels) to an object admitted before this
        # webhook existed must go through, or such a claim could never be deleted.
        return Decision(True, unchecked="devices unchanged")
    problems = object_problems(req.kind, req.object, driver)
    return Decision(not problems, tuple(problems))


def message(req: Request, problems: tuple[Problem, ...]) -> str:
    return f"{req.display_name}: " + "; ".join(p.message for p in problems)


def response(req: Request, decision: Decision) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": req.uid, "allowed": decision.allowed}
    if not decision.allowed:
        resp["status"] = {
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": message(req, decision.problems),
        }
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}
