"""The kind end-to-end tests: `make kind-test` (CI runs it after `make test`).

They need a Docker engine (or root to start Debian's) and build a kind cluster, so the
plain `pytest` of `make test` does not collect them: DRADRIVER_KIND_TESTS=1 does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dradriver_dev.kind import cluster, demo

if not os.environ.get("DRADRIVER_KIND_TESTS"):
    collect_ignore_glob = ["test_*.py"]


# The tests' own cluster: a `make kind-demo` cluster left running is not theirs to touch.
E2E_CLUSTER = "dradriver-e2e"


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[demo.Kind]:
    os.environ.setdefault("DRADRIVER_KIND_NAME", E2E_CLUSTER)
    k = demo.up("dev", fresh=True)
    try:
        yield k
    finally:
        if not os.environ.get("DRADRIVER_KIND_KEEP"):
            cluster.down(k.kind)
