"""check_limits holds device and attribute names to the API server's rules to the last
character: a trailing newline is not a DNS label, nor part of an attribute name."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.slices.build import LimitError, SliceContent, check_limits


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ({"name": "gpu-0\n", "attributes": {}}, "not a DNS label"),
        ({"name": "gpu-0", "attributes": {"productName\n": {"string": "x"}}}, "attribute name"),
    ],
)
def test_a_trailing_newline_in_a_name_is_refused(device: dict[str, Any], message: str) -> None:
    with pytest.raises(LimitError, match=message):
        check_limits([SliceContent(key="k", devices=(device,))])
