"""The caBundle and failurePolicy patch: ours added, others kept, guarded by the version."""

from __future__ import annotations

import base64
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from dradriver.controller import cabundle, tls
from dradriver.k8s import KubeError

NOW = tls.utcnow()


@pytest.fixture(scope="module")
def cas() -> list[bytes]:
    return [tls.CertificateAuthority(NOW, dt.timedelta(days=30)).pem for _ in range(5)]


def b64(*pems: bytes) -> str:
    return base64.b64encode(b"".join(pems)).decode()


def pems(bundle_b64: str) -> list[bytes]:
    return [
        c.public_bytes(Encoding.PEM)
        for c in x509.load_pem_x509_certificates(base64.b64decode(bundle_b64))
    ]


def config(*webhooks: dict[str, Any], rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": "adm", "resourceVersion": rv}, "webhooks": list(webhooks)}


def webhook(bundle: str | None = None, policy: str | None = "Fail") -> dict[str, Any]:
    wh: dict[str, Any] = {"name": "claims.gpu.dradriver.io", "clientConfig": {"url": "https://x"}}
    if bundle is not None:
        wh["clientConfig"]["caBundle"] = bundle
    if policy:
        wh["failurePolicy"] = policy
    return wh


def test_empty_bundle_gets_ours(cas: list[bytes]) -> None:
    assert pems(cabundle.merged_bundle("", cas[0], NOW) or "") == [cas[0]]


def test_ours_already_there_is_left_alone(cas: list[bytes]) -> None:
    assert cabundle.merged_bundle(b64(cas[1], cas[0]), cas[0], NOW) is None


def test_other_cas_are_kept_after_ours_up_to_the_limit(cas: list[bytes]) -> None:
    merged = cabundle.merged_bundle(b64(*cas[1:]), cas[0], NOW) or ""
    assert pems(merged) == cas[: cabundle.MAX_CAS]


def test_expired_and_garbage_bundles_are_dropped(cas: list[bytes]) -> None:
    later = NOW + dt.timedelta(days=60)
    assert pems(cabundle.merged_bundle(b64(cas[1]), cas[0], later) or "") == [cas[0]]
    assert pems(cabundle.merged_bundle("not base64!", cas[0], NOW) or "") == [cas[0]]
    junk = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nxx\n").decode()
    assert pems(cabundle.merged_bundle(junk, cas[0], NOW) or "") == [cas[0]]


def test_patch_ops_every_webhook_guarded_by_resource_version(cas: list[bytes]) -> None:
    cfg = config(webhook(), webhook(b64(cas[0]), policy="Ignore"), webhook(b64(cas[0])))
    ops = cabundle.patch_ops(cfg, cas[0], "Fail", now=NOW)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert [(o["op"], o["path"]) for o in ops[1:]] == [
        ("add", "/webhooks/0/clientConfig/caBundle"),
        ("add", "/webhooks/1/failurePolicy"),
    ]
    assert ops[2]["value"] == "Fail"
    # None leaves the policy as the configuration has it.
    assert cabundle.patch_ops(cfg, cas[0], None, now=NOW)[1:] == ops[1:2]
    assert cabundle.patch_ops(config(webhook(b64(cas[0]))), cas[0], "Fail", now=NOW) == []
    assert cabundle.patch_ops(config(), cas[0], "Fail", now=NOW) == []


class FakeKube:
    """list/watch/patch of one webhook configuration, as the API server answers them."""

    def __init__(self, obj: dict[str, Any] | None, created: dict[str, Any] | None = None) -> None:
        self.obj, self.created = obj, created
        self.patches: list[list[dict[str, Any]]] = []
        self.fail_patches = 0
        self.lists = 0

    def list(self, path: str, **query: Any) -> dict[str, Any]:
        assert path.endswith("/validatingwebhookconfigurations")
        assert query == {"fieldSelector": "metadata.name=adm"}
        self.lists += 1
        return {"metadata": {"resourceVersion": "1"}, "items": [self.obj] if self.obj else []}

    def watch(self, path: str, **kw: Any) -> Iterator[dict[str, Any]]:
        assert kw["fieldSelector"] == "metadata.name=adm"
        if self.created is not None:
            self.obj, self.created = self.created, None
            yield {"type": "ADDED", "object": self.obj}
        # the server ends the watch here

    def patch(self, path: str, body: Any, patch_type: str) -> dict[str, Any]:
        assert path.endswith("/validatingwebhookconfigurations/adm") and patch_type == "json"
        if self.fail_patches:
            self.fail_patches -= 1
            raise KubeError(422, "Invalid", "the test operation failed")
        assert self.obj is not None
        self.patches.append(body)
        for op in body[1:]:  # apply them, as the API server would
            _, _, i, *keys = op["path"].split("/")
            target = self.obj["webhooks"][int(i)]
            for k in keys[:-1]:
                target = target[k]
            target[keys[-1]] = op["value"]
        return {}


def run_until(kube: FakeKube, cas: list[bytes]) -> cabundle.CaBundleSyncer:
    stop = threading.Event()
    s = cabundle.CaBundleSyncer(
        kube, "adm", lambda: cas[0], failure_policy="Fail", clock=tls.utcnow
    )  # type: ignore[arg-type]
    t = threading.Thread(target=s.run, args=(stop,), daemon=True)
    t.start()
    for _ in range(500):
        if s.patched.is_set():
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)
    stop.set()
    t.join(5)
    return s


def test_waits_for_the_object_then_patches_it_when_created(cas: list[bytes]) -> None:
    kube = FakeKube(None, created=config(webhook("")))
    s = run_until(kube, cas)
    assert s.patched.is_set() and s.last_error == ""
    assert [o["path"] for o in kube.patches[0]] == [
        "/metadata/resourceVersion",
        "/webhooks/0/clientConfig/caBundle",
    ]
    assert len(kube.patches) == 1  # the next list finds it patched
    assert kube.lists <= 2  # a watch that ends at once is not a busy loop


def test_a_failed_patch_is_retried_and_readiness_waits_for_it(cas: list[bytes]) -> None:
    kube = FakeKube(config(webhook()))
    kube.fail_patches = 1
    s = run_until(kube, cas)
    assert s.patched.is_set() and len(kube.patches) == 1


class ResumingKube(FakeKube):
    """Watches that end at their timeout: each the next of `streams`."""

    def __init__(self, obj: dict[str, Any], streams: list[list[dict[str, Any]]]) -> None:
        super().__init__(obj)
        self.streams = streams
        self.watched_from: list[str | None] = []
        self.stop = threading.Event()

    def watch(self, path: str, **kw: Any) -> Iterator[dict[str, Any]]:
        self.watched_from.append(kw["resource_version"])
        if not self.streams:
            self.stop.set()
            return
        yield from self.streams.pop(0)


def test_a_watch_that_ends_is_resumed_from_its_last_version_without_a_list(
    cas: list[bytes],
) -> None:
    patched = config(webhook(b64(cas[0])), rv="8")
    kube = ResumingKube(
        config(webhook(b64(cas[0]))),
        [
            [{"type": "MODIFIED", "object": patched}],
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}],
        ],
    )
    s = cabundle.CaBundleSyncer(
        kube, "adm", lambda: cas[0], failure_policy="Fail", clock=tls.utcnow
    )  # type: ignore[arg-type]
    t = threading.Thread(target=s.run, args=(kube.stop,), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert kube.lists == 1
    assert kube.watched_from == ["1", "8", "12"]
    assert s.patched.is_set() and kube.patches == []  # ours was there already


def test_a_patch_refused_during_a_watch_lists_again(cas: list[bytes]) -> None:
    kube = ResumingKube(
        config(webhook(b64(cas[0]))),
        [[{"type": "MODIFIED", "object": config(webhook(""), rv="9")}]],
    )
    kube.fail_patches = 1
    s = cabundle.CaBundleSyncer(
        kube, "adm", lambda: cas[0], failure_policy="Fail", clock=tls.utcnow
    )  # type: ignore[arg-type]
    t = threading.Thread(target=s.run, args=(kube.stop,), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert kube.lists == 2  # the refusal, then what the object is now
    assert kube.watched_from == ["1", "1"]
