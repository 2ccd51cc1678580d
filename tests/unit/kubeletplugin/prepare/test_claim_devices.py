"""The claim reference the kubelet sends becomes file names and API paths: only a
Kubernetes UID and names get through, to the last character."""

from __future__ import annotations

import pytest

from dradriver.errors import RequestError
from dradriver.kubeletplugin.prepare.claim_devices import check_ref
from dradriver.kubeletplugin.state.records import ClaimRef

UID = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        # `$` after re.match also matches before a final newline: these passed.
        (ClaimRef("team", UID + "\n", "train"), "is not a Kubernetes UID"),
        (ClaimRef("team\n", UID, "train"), "not a valid Kubernetes name"),
        (ClaimRef("team", UID, "train\n"), "not a valid Kubernetes name"),
        (ClaimRef("team", UID + "\nx", "train"), "is not a Kubernetes UID"),
    ],
)
def test_a_trailing_newline_is_refused(ref: ClaimRef, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        check_ref(ref)
