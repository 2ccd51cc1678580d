from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakenvml import FakeNvml, load
from tests.support.fakes import Start


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """start(spec, node=..., state_dir=...) -> a fake node with nvmlInit() done."""
    started: list[FakeNvml] = []

    def _start(spec: str, *, node: str = "node-a", state_dir: Path | None = tmp_path) -> FakeNvml:
        fake = load(spec, node=node, state_dir=state_dir)
        fake.pynvml.nvmlInit()
        started.append(fake)
        return fake

    yield _start
    for fake in started:
        while fake.library.initialized:
            fake.pynvml.nvmlShutdown()
