"""The scheduler's view of a device in CEL: `device.driver`, `device.attributes[domain]`,
`device.capacity[domain]` and Kubernetes' quantity and semver libraries, on Google's CEL
runtime. Quantities and versions are small protobuf messages so that the runtime can pass
them around and type-check the methods called on them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from dradriver.api import quantity
from dradriver.diagnose import semver

_PACKAGE = "dradriver.cel"
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64


def _messages() -> tuple[Any, type[Any], type[Any]]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="dradriver/cel.proto", package=_PACKAGE, syntax="proto3"
    )
    q = fdp.message_type.add(name="Quantity")
    # The exact value as a reduced fraction ("85520809984", "3/2"): equal quantities are
    # equal messages, as 1Gi == 1024Mi is true in Kubernetes' CEL.
    q.field.add(name="exact", number=1, type=_STRING, label=1)
    v = fdp.message_type.add(name="Semver")
    for n, name in enumerate(("major", "minor", "patch"), start=1):
        v.field.add(name=name, number=n, type=_INT64, label=1)
    v.field.add(name="pre", number=4, type=_STRING, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)

    def cls(name: str) -> type[Any]:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))

    return pool, cls("Quantity"), cls("Semver")


_POOL, _Quantity, _Semver = _messages()
_QT = cel.Type(f"{_PACKAGE}.Quantity")
_VT = cel.Type(f"{_PACKAGE}.Semver")
_INT, _BOOL, _STR, _DOUBLE = cel.Type.INT, cel.Type.BOOL, cel.Type.STRING, cel.Type.DOUBLE


def quantity_value(text: str) -> Any:
    return _quantity_msg(quantity.parse(text))


def _quantity_msg(v: Fraction) -> Any:
    return _Quantity(exact=str(v))


def _frac(q: Any) -> Fraction:
    return Fraction(q.exact)


def version_value(text: str, normalize: bool = False) -> Any:
    v = semver.parse(text, normalize)
    return _Semver(major=v.major, minor=v.minor, patch=v.patch, pre=v.pre)


def _ver(m: Any) -> semver.Version:
    return semver.Version(m.major, m.minor, m.patch, m.pre)


def _cmp(a: Fraction, b: Fraction) -> int:
    return (a > b) - (a < b)


def _as_integer(q: Any) -> int:
    v = _frac(q)
    if v.denominator != 1 or not -(2**63) <= v.numerator < 2**63:
        raise ValueError("cannot convert value to integer")
    return v.numerator


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, _Semver) and isinstance(b, _Semver):
        return semver.compare(_ver(a), _ver(b))
    if isinstance(a, _Quantity) and isinstance(b, _Quantity):
        return _cmp(_frac(a), _frac(b))
    raise ValueError("no such overload: quantities compare with quantities, semvers with semvers")


def _is_ok(parse: Callable[[], object]) -> bool:
    try:
        parse()
    except ValueError:
        return False
    return True


def _overload(
    oid: str, ret: Any, params: list[Any], impl: Callable[..., Any], member: bool = False
) -> Any:
    return cel.Overload(oid, ret, params, is_member=member, impl=impl)


def _is_quantity(s: str) -> bool:
    return _is_ok(lambda: quantity.parse(s))


def _is_semver(s: str, normalize: bool = False) -> bool:
    return _is_ok(lambda: semver.parse(s, normalize))


def _q_sign(q: Any) -> int:
    return _cmp(_frac(q), Fraction(0))


def _q_is_integer(q: Any) -> bool:
    return _is_ok(lambda: _as_integer(q))


def _q_float(q: Any) -> float:
    return float(_frac(q))


def _q_add(a: Any, b: Any) -> Any:
    return _quantity_msg(_frac(a) + (b if isinstance(b, int) else _frac(b)))


def _q_sub(a: Any, b: Any) -> Any:
    return _quantity_msg(_frac(a) - (b if isinstance(b, int) else _frac(b)))


def _greater(a: Any, b: Any) -> bool:
    return _compare(a, b) > 0


def _less(a: Any, b: Any) -> bool:
    return _compare(a, b) < 0


def _functions() -> list[Any]:
    d, o, m = cel.FunctionDecl, _overload, True
    return [
        d("quantity", [o("quantity_string", _QT, [_STR], quantity_value)]),
        d("isQuantity", [o("is_quantity_string", _BOOL, [_STR], _is_quantity)]),
        d("semver", [
            o("semver_string", _VT, [_STR], version_value),
            o("semver_string_bool", _VT, [_STR, _BOOL], version_value),
        ]),
        d("isSemver", [
            o("is_semver_string", _BOOL, [_STR], _is_semver),
            o("is_semver_string_bool", _BOOL, [_STR, _BOOL], _is_semver),
        ]),
        d("sign", [o("quantity_sign", _INT, [_QT], _q_sign, m)]),
        d("isInteger", [o("quantity_is_integer", _BOOL, [_QT], _q_is_integer, m)]),
        d("asInteger", [o("quantity_as_integer", _INT, [_QT], _as_integer, m)]),
        d("asApproximateFloat", [o("quantity_as_float", _DOUBLE, [_QT], _q_float, m)]),
        d("add", [
            o("quantity_add", _QT, [_QT, _QT], _q_add, m),
            o("quantity_add_int", _QT, [_QT, _INT], _q_add, m),
        ]),
        d("sub", [
            o("quantity_sub", _QT, [_QT, _QT], _q_sub, m),
            o("quantity_sub_int", _QT, [_QT, _INT], _q_sub, m),
        ]),
        # Quantity and Semver are both messages to the runtime, which keys implementations
        # by kind: one implementation per name serves both declared overloads.
        d("isGreaterThan", [
            o("quantity_greater", _BOOL, [_QT, _QT], _greater, m),
            cel.Overload("semver_greater", _BOOL, [_VT, _VT], is_member=m),
        ]),
        d("isLessThan", [
            o("quantity_less", _BOOL, [_QT, _QT], _less, m),
            cel.Overload("semver_less", _BOOL, [_VT, _VT], is_member=m),
        ]),
        d("compareTo", [
            o("quantity_compare", _INT, [_QT, _QT], _compare, m),
            cel.Overload("semver_compare", _INT, [_VT, _VT], is_member=m),
        ]),
        d("major", [o("semver_major", _INT, [_VT], lambda v: v.major, m)]),
        d("minor", [o("semver_minor", _INT, [_VT], lambda v: v.minor, m)]),
        d("patch", [o("semver_patch", _INT, [_VT], lambda v: v.patch, m)]),
    ]  # fmt: skip


@cache
def _env() -> Any:
    return cel.NewEnv(
        _POOL,
        variables={"device": cel.Type.Map(_STR, cel.Type.DYN)},
        extensions=[
            ext_bindings.ExtBindings(),
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
        ],
        functions=_functions(),
    )


@dataclass(frozen=True)
class Device:
    """A published device as CEL sees it: attributes and capacity by domain, unqualified
    names under the driver's own domain."""

    driver: str
    attributes: Mapping[str, Mapping[str, object]]  # domain -> id -> int|bool|str|Semver
    capacity: Mapping[str, Mapping[str, Fraction]]
    allow_multiple_allocations: bool = False


def device_from_api(driver: str, spec: Mapping[str, Any]) -> Device:
    """From a ResourceSlice's device entry (resource.k8s.io/v1)."""
    attributes: dict[str, dict[str, object]] = {}
    for name, value in (spec.get("attributes") or {}).items():
        domain, _, ident = name.rpartition("/")
        v: object
        if "version" in value:
            v = semver.parse(str(value["version"]))
        elif "int" in value:
            v = int(value["int"])
        elif "bool" in value:
            v = bool(value["bool"])
        else:
            v = str(value.get("string", ""))
        attributes.setdefault(domain or driver, {})[ident] = v
    capacity: dict[str, dict[str, Fraction]] = {}
    for name, value in (spec.get("capacity") or {}).items():
        domain, _, ident = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[ident] = quantity.parse(str(value["value"]))
    return Device(driver, attributes, capacity, bool(spec.get("allowMultipleAllocations")))


_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')


class CompileError(Exception):
    pass


@dataclass(frozen=True)
class Outcome:
    matches: bool
    error: str = ""  # a CEL runtime error: the scheduler stops at the first one


class Selector:
    """One compiled selector expression."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._program = _env().compile(expression)
        except RuntimeError as exc:
            raise CompileError(_clean(str(exc))) from exc
        # Kubernetes answers an unknown domain with an empty map instead of an error; the
        # domains an expression can name are among its string literals.
        self._domains = {a or b for a, b in _LITERAL.findall(expression)}

    def evaluate(self, device: Device) -> Outcome:
        attributes = {d: dict(v) for d, v in device.attributes.items()}
        capacity: dict[str, dict[str, Any]] = {
            d: {k: _quantity_msg(q) for k, q in v.items()} for d, v in device.capacity.items()
        }
        for d in self._domains:
            attributes.setdefault(d, {})
            capacity.setdefault(d, {})
        data = {
            "device": {
                "driver": device.driver,
                "allowMultipleAllocations": device.allow_multiple_allocations,
                "attributes": {
                    d: {k: _cel_value(v) for k, v in m.items()} for d, m in attributes.items()
                },
                "capacity": capacity,
            }
        }
        try:
            result = self._program.eval(data=data)
        except Exception as exc:  # the runtime raises for errors it does not wrap as values
            return Outcome(False, _clean(str(exc)))
        if result.type() == cel.Type.ERROR:
            return Outcome(False, _clean(str(result.value())))
        value = result.value()
        if not isinstance(value, bool):
            return Outcome(False, f"the selector returned {value!r}, not a bool")
        return Outcome(value)


def _cel_value(v: object) -> object:
    if isinstance(v, semver.Version):
        return _Semver(major=v.major, minor=v.minor, patch=v.patch, pre=v.pre)
    return v


_STATUS = re.compile(r"^[A-Z_]+: |\s*\[[A-Z_]+\]$")


def _clean(message: str) -> str:
    """The runtime's message without its status codes ("NOT_FOUND: ... [NOT_FOUND]")."""
    return _STATUS.sub("", " ".join(message.split())).strip()
