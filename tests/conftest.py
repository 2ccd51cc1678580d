"""What every test session checks before it starts."""

from __future__ import annotations

import os

import pytest

_EXTERNAL = ("DRADRIVER_TEST_KUBECONFIG", "DRADRIVER_TEST_ALPHA_KUBECONFIG")


def pytest_configure(config: pytest.Config) -> None:
    # Each xdist worker starts its own control planes; pointed at one running cluster they
    # would share its cluster-wide objects (DeviceClasses, Kueue's queues, the webhook),
    # which the tests create and delete as if they were alone.
    named = [v for v in _EXTERNAL if os.environ.get(v)]
    if named and config.getoption("dist", "no") != "no":
        raise pytest.UsageError(
            f"{' and '.join(named)} points every test worker at one control plane: run the "
            "tests in one process (make test TEST_WORKERS=0, or pytest without -n)"
        )
