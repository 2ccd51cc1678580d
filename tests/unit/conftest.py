"""Unit tests behave as on a machine without /var/lib/dradriver. The node flags' state
directory defaults to it, and `dradriver devices --devices fake:...` keeps the fake GPUs'
MIG state there whenever it exists (as on a node, where the plugin's state is what to
show), so once anything had made it, one test's fake GPUs were refused by the next as
"other GPUs than this device spec"."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_default_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory that does not exist; flags.add reads DRADRIVER_<FLAG> whenever a parser
    # is built, so every main() sees it. Tests that want state pass --state-dir.
    absent = tmp_path_factory.mktemp("state") / "absent"
    monkeypatch.setenv("DRADRIVER_STATE_DIR", str(absent))
