"""A rollback by one release keeps working: this release, meeting a file or a claim a
later release marked with a higher "minReader", refuses only what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.checkpoint.codec import payload_checksum
from tests.support.gpu_names import fake_names, real
from tests.support.node import DRIVER, NODE, allocated_claim, fake_preparer

SPEC = "2xH100-80GB"


def dev(name: str) -> str:
    return real(name, fake_names(SPEC, NODE))


def _ref(c: dict[str, Any]) -> ClaimRef:
    return ClaimRef("team", c["metadata"]["uid"], c["metadata"]["name"])


def prepared_node(tmp: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    claims = {
        "a": allocated_claim("a", dev("gpu-0-mig-3g40gb-4")),
        "b": allocated_claim("b", dev("gpu-1")),
    }
    driver, _ = fake_preparer(tmp, SPEC, lambda ref: claims[ref.name])
    for name in ("a", "b"):
        assert driver.prepare([_ref(claims[name])])[_ref(claims[name]).uid].error == ""
    return driver, claims


def rewrite(path: Path, change: Any) -> None:
    """The file as a later release would write it: `change` edits the document, the
    checksum is made again."""
    doc = json.loads(path.read_text())
    change(doc)
    doc["checksum"] = payload_checksum(doc["payload"])
    path.write_text(json.dumps(doc))


def test_a_later_file_this_release_may_read_is_served(tmp_path: Path) -> None:
    """A later release wrote "version": 2 with fields this one does not know, and says a
    version-1 reader can read it: prepare and unprepare work, and its fields survive."""
    _driver, claims = prepared_node(tmp_path)
    path = tmp_path / "checkpoint.json"
    a = _ref(claims["a"])

    def later(doc: dict[str, Any]) -> None:
        doc["version"], doc["minReader"] = 2, 1
        doc["payload"]["claims"][a.uid]["leases"] = [{"pod": "p"}]

    rewrite(path, later)
    restarted, _nvml = fake_preparer(tmp_path, SPEC, lambda ref: claims[ref.name])
    restarted.reconcile()
    assert restarted.refusal == ""
    c = allocated_claim("c", dev("gpu-0-mig-3g40gb-0"))
    claims["c"] = c
    assert restarted.prepare([_ref(c)])[_ref(c).uid].error == ""
    assert restarted.unprepare([_ref(claims["b"])]) == {_ref(claims["b"]).uid: ""}
    doc = json.loads(path.read_text())
    assert doc["payload"]["claims"][a.uid]["leases"] == [{"pod": "p"}]
    assert set(doc["payload"]["claims"]) == {a.uid, _ref(c).uid}


def test_a_claim_only_a_later_release_can_read_is_refused_alone(tmp_path: Path) -> None:
    _driver, claims = prepared_node(tmp_path)
    path = tmp_path / "checkpoint.json"
    a, b = _ref(claims["a"]), _ref(claims["b"])

    def later(doc: dict[str, Any]) -> None:
        rec = doc["payload"]["claims"][a.uid]
        rec["minReader"], rec["state"] = 2, "PrepareResumable"

    rewrite(path, later)
    raw = json.loads(path.read_text())["payload"]["claims"][a.uid]
    restarted, nvml = fake_preparer(tmp_path, SPEC, lambda ref: claims[ref.name])
    restarted.reconcile()
    assert restarted.refusal == ""  # the file is served ...
    gpu0 = nvml.backend.machine.gpus[0]
    assert len(gpu0.gpu_instances) == 1  # ... and the claim it cannot read left as it is
    err = restarted.unprepare([a])[a.uid]
    assert "recorded by a newer dradriver release" in err and "Roll the plugin forward" in err
    assert "newer dradriver release" in restarted.prepare([a])[a.uid].error
    assert len(gpu0.gpu_instances) == 1
    spec = tmp_path / "cdi" / f"{DRIVER}-claim-{a.uid}.json"
    assert spec.exists()
    assert restarted.unprepare([b]) == {b.uid: ""}  # the others work
    doc = json.loads(path.read_text())
    assert doc["payload"]["claims"] == {a.uid: raw}  # kept verbatim through the saves
    assert doc["minReader"] == 1


def test_a_file_only_a_later_release_can_read_is_refused_and_left_untouched(
    tmp_path: Path,
) -> None:
    _driver, claims = prepared_node(tmp_path)
    path = tmp_path / "checkpoint.json"
    rewrite(path, lambda doc: doc.update(version=3, minReader=3))
    before = path.read_bytes()
    restarted, _ = fake_preparer(tmp_path, SPEC, lambda ref: claims[ref.name])
    restarted.reconcile()
    assert "readable from format 3" in restarted.refusal
    b = _ref(claims["b"])
    assert "newer dradriver release" in restarted.unprepare([b])[b.uid]
    assert path.read_bytes() == before
