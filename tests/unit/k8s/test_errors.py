"""One error class per API status a caller branches on, each still a KubeError with its
status, reason and the Status body's message."""

from __future__ import annotations

import json

import pytest

from dradriver.k8s import (
    Conflict,
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    TooManyRequests,
    Unauthorized,
)
from dradriver.k8s.errors import error_from_response


@pytest.mark.parametrize(
    "status, cls",
    [
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (410, Gone),
        (429, TooManyRequests),
        (500, KubeError),
    ],
)
def test_each_status_its_class(status: int, cls: type[KubeError]) -> None:
    body = json.dumps({"kind": "Status", "reason": "Why", "message": "what happened"}).encode()
    err = error_from_response(status, "Phrase", body)
    assert type(err) is cls and isinstance(err, KubeError)
    assert (err.status, err.reason, err.message) == (status, "Why", "what happened")


def test_a_body_that_is_no_status_is_kept_as_the_message() -> None:
    err = error_from_response(403, "Forbidden", b"<html>denied</html>")
    assert isinstance(err, Forbidden) and err.message == "<html>denied</html>"
