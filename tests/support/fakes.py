"""Types of the fake NVML library's fixtures (tests/unit/fakenvml/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from fakenvml import FakeNvml

# start(spec, node=..., state_dir=...) -> a fake node with nvmlInit() done.
Start = Callable[..., FakeNvml]
