"""Driver versions as a slice's semver attribute: numeric parts only, to the last character."""

from __future__ import annotations

import pytest

from dradriver.inventory.versions import semver


def test_driver_versions_become_semver() -> None:
    assert semver("535.104.05") == "535.104.5"
    assert semver("550.54\n") == "550.54.0"  # as nvidia-smi prints it: the ends are stripped


@pytest.mark.parametrize("raw", ["535\n.104", "535.104\n.05", "535.x", "535..1", "1.2.3.4"])
def test_a_part_that_is_not_a_number_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="not a numeric version"):
        semver(raw)
