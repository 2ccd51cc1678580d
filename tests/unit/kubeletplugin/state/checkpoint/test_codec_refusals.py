"""A checkpoint a newer release wrote in a form only it can read (its minReader above
this release's format) is refused loudly and left alone: an older plugin (a rollback)
neither undoes, redoes nor rewrites the claims it records (a newer state it does not know
once tore running claims down), and says what to do. One that says this release can read
it is served as usual (test_checkpoint_compat.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dradriver.kubeletplugin.prepare.plan import ClaimRef
from tests.support.gpu_names import fake_names, real
from tests.support.node import DRIVER, NODE, allocated_claim, fake_preparer


def _ref(c: dict[str, Any]) -> ClaimRef:
    return ClaimRef("team", c["metadata"]["uid"], c["metadata"]["name"])


def test_a_newer_checkpoint_is_refused_and_left_untouched(tmp_path: Path) -> None:
    gpus = fake_names("2xH100-80GB", NODE)  # by NVML index
    claims = {
        "a": allocated_claim("a", real("gpu-0-mig-3g40gb-4", gpus)),
        "b": allocated_claim("b", real("gpu-1", gpus)),
    }
    driver, _nvml = fake_preparer(tmp_path, "2xH100-80GB", lambda ref: claims[ref.name])
    assert driver.prepare([_ref(claims["a"])])[_ref(claims["a"]).uid].error == ""
    # What a newer release would write after an incompatible change (same payload, a
    # higher version, and a reader no older than itself).
    path = tmp_path / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["version"] = 2
    doc["minReader"] = 2
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    spec = tmp_path / "cdi" / f"{DRIVER}-claim-{_ref(claims['a']).uid}.json"
    assert spec.exists()

    restarted, nvml2 = fake_preparer(tmp_path, "2xH100-80GB", lambda ref: claims[ref.name])
    restarted.reconcile()
    assert "written by a newer dradriver release" in restarted.refusal
    gpu0 = nvml2.backend.machine.gpus[0]
    assert [(gi.profile.name, gi.start) for gi in gpu0.gpu_instances.values()] == [("3g.40gb", 4)]
    assert spec.exists() and path.read_bytes() == before
    new = restarted.prepare([_ref(claims["b"])])[_ref(claims["b"]).uid]
    assert "newer dradriver release" in new.error and "Roll the plugin forward" in new.error
    old = restarted.unprepare([_ref(claims["a"])])[_ref(claims["a"]).uid]
    assert "newer dradriver release" in old
    assert gpu0.gpu_instances and path.read_bytes() == before and spec.exists()
