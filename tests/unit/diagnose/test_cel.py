"""The DRA CEL environment explain evaluates selectors in: Kubernetes' semantics for
attributes, capacity, unknown domains, quantities and semantic versions."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest

from dradriver.api import quantity
from dradriver.diagnose import semver
from dradriver.diagnose.cel import CompileError, Selector, device_from_api
from dradriver.diagnose.nearest import MissingName, missing_name
from dradriver.diagnose.world import Published

D = "gpu.dradriver.io"
H100 = device_from_api(
    D,
    {
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "driverVersion": {"version": "570.86.15"},
            "index": {"int": 0},
            "migCapable": {"bool": True},
            "example.com/rack": {"string": "r1"},
        },
        "capacity": {"memory": {"value": "85520809984"}},
    },
)


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        (f'device.driver == "{D}"', True),
        (f'device.attributes["{D}"].productName == "NVIDIA H100 80GB HBM3"', True),
        (f'device.attributes["{D}"].index == 0 && device.attributes["{D}"].migCapable', True),
        ('device.attributes["example.com"].rack == "r1"', True),
        # 80GB is 79.6Gi: the trap the issue names.
        (f'device.capacity["{D}"].memory.compareTo(quantity("80Gi")) >= 0', False),
        (f'device.capacity["{D}"].memory.isGreaterThan(quantity("79Gi"))', True),
        (f'device.capacity["{D}"].memory.isLessThan(quantity("80G"))', False),
        (f'device.capacity["{D}"].memory == quantity("85520809984")', True),
        ('quantity("1Gi") == quantity("1024Mi")', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("500m").add(quantity("500m")).asInteger() == 1', True),
        ('quantity("1k").sub(1).asInteger() == 999', True),
        ('quantity("-2").sign() == -1', True),
        (f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("550.0.0"))', True),
        (f'device.attributes["{D}"].driverVersion.compareTo(semver("570.86.15")) == 0', True),
        (f'device.attributes["{D}"].driverVersion.major() == 570', True),
        ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
        ('semver("v1.2", true) == semver("1.2.0")', True),
        ('isSemver("1.2") || isQuantity("x")', False),
        # An unknown domain is an empty map, as in Kubernetes, so has() is false...
        ('has(device.attributes["other.io"].x)', False),
        (
            f'cel.bind(g, device.attributes["{D}"], g.index == 0 && g.productName.contains("H1"))',
            True,
        ),
    ],
)
def test_selectors_match_as_the_scheduler_does(expression: str, matches: bool) -> None:
    outcome = Selector(expression).evaluate(H100)
    assert outcome.error == ""
    assert outcome.matches is matches


def test_a_missing_attribute_is_a_runtime_error_not_a_mismatch() -> None:
    """...but reading a name the device lacks is the error that stops the scheduler."""
    for expression in (
        f'device.attributes["{D}"].memoryGB > 40',
        'device.attributes["other.io"].x == 1',
    ):
        outcome = Selector(expression).evaluate(H100)
        assert outcome.matches is False
        assert "key" in outcome.error.lower(), outcome


def test_a_syntax_error_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="Syntax error"):
        Selector('device.attributes["x"].')
    with pytest.raises(CompileError, match="undeclared reference"):
        Selector("nosuchfunction(1)")


def test_quantities_are_exact() -> None:
    assert quantity.parse("80Gi") == 80 * 2**30
    assert quantity.parse("500m") == Fraction(1, 2)
    assert quantity.parse("1e3") == 1000
    assert quantity.parse("-1.5k") == -1500
    assert quantity.human(85520809984) == "79.6Gi"
    assert quantity.human(Fraction(1, 2)) == "0.5"
    assert quantity.human(7) == "7"
    with pytest.raises(quantity.QuantityError):
        quantity.parse("80 GB")


def test_semver_precedence() -> None:
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta.2", "1.0.0-beta.11"]
    order += ["1.0.0-rc.1", "1.0.0", "1.2.0", "10.0.0"]
    parsed = [semver.parse(v) for v in order]
    for a, b in itertools.pairwise(parsed):
        assert semver.compare(a, b) == -1 and semver.compare(b, a) == 1
    assert semver.parse("1.2.3+build.5") == semver.parse("1.2.3")
    with pytest.raises(semver.SemverError):
        semver.parse("1.2")


def _published(device: Any, name: str = "gpu-0") -> Published:
    return Published(D, "n1", name, "n1", device, {})


L4 = device_from_api(
    D,
    {
        "name": "gpu-1",
        "attributes": {"productName": {"string": "NVIDIA L4"}, "index": {"int": 1}},
        "capacity": {"memory": {"value": "24Gi"}},
    },
)
FLEET = [_published(H100), _published(L4, "gpu-1")]


def _missing(expression: str) -> MissingName | None:
    """What explain makes of the runtime error `expression` meets on the first device."""
    error = Selector(expression).evaluate(H100).error
    assert error, f"{expression} should fail at run time on the H100"
    return missing_name(expression, error, FLEET)


@pytest.mark.parametrize(
    ("expression", "what", "suggestion"),
    [
        # The typo: the nearest name the slices publish under the same domain.
        (f'device.attributes["{D}"].product == "x"', f"attribute {D}/product",
         f'device.attributes["{D}"].productName'),
        (f'device.attributes["{D}"]["prodcutName"] == "x"', f"attribute {D}/prodcutName",
         f'device.attributes["{D}"].productName'),
        (f'device.capacity["{D}"].memry.isGreaterThan(quantity("1"))', f"capacity {D}/memry",
         f'device.capacity["{D}"].memory'),
        # The right name in the wrong place: a capacity read as an attribute, a domain typo.
        (f'device.attributes["{D}"].memory == 1', f"attribute {D}/memory",
         f'device.capacity["{D}"].memory'),
        ('device.attributes["gpu.dradriver.oi"].index == 0', "attribute gpu.dradriver.oi/index",
         f'device.attributes["{D}"].index'),
        # Nothing published is close: no guess.
        (f'device.attributes["{D}"].memoryGB >= 80', f"attribute {D}/memoryGB", ""),
    ],
)  # fmt: skip
def test_a_name_no_device_publishes_gets_the_nearest_published_name(
    expression: str, what: str, suggestion: str
) -> None:
    miss = _missing(expression)
    assert miss is not None
    assert (miss.what, miss.holders, miss.suggestion) == (what, 0, suggestion)


def test_the_published_names_and_who_has_a_name_some_devices_lack() -> None:
    miss = _missing(f'device.attributes["{D}"].memoryGB >= 80')
    assert miss is not None and miss.published == ("driverVersion", "index", "migCapable",
                                                   "productName")  # fmt: skip
    # migCapable is the H100's alone: one of the two has it, and that is no typo.
    error = Selector(f'device.attributes["{D}"].migCapable').evaluate(L4).error
    miss = missing_name(f'device.attributes["{D}"].migCapable', error, FLEET)
    assert miss is not None and miss.holders == 1


def test_kubernetes_wording_of_the_error_is_read_too_and_other_errors_are_not_names() -> None:
    expression = f'device.attributes["{D}"].product == "x"'
    miss = missing_name(expression, "no such key: product", FLEET)
    assert miss is not None and miss.suggestion == f'device.attributes["{D}"].productName'
    assert missing_name(expression, "no such overload: string > int", FLEET) is None
    # A key the expression does not read from a device's maps (a map literal of its own).
    assert missing_name('{"a": 1}["b"] == 1', 'Key not found in map : "b"', FLEET) is None
