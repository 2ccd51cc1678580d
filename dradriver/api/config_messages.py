"""What a refusal says: pydantic's validation errors retold as messages that name the
field path, what is allowed there and the nearest thing to what was written. Its own
file because it reads any model's declarations generically (fields, literals, bounds,
descriptions) rather than knowing the API's kinds: a message's wording changes here
alone, and the models stay as readable as the API they define.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from dradriver.api.echo import cut, echo
from dradriver.api.suggest import did_you_mean

STRICT_TYPES = ("int_type", "int_from_float", "bool_type", "string_type", "dict_type")
# A config has a handful of fields: past this many problems the rest are counted, not
# listed (500 unknown keys made a 37 KB message).
MAX_PROBLEMS = 5


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        # A string part may be any key the user wrote (a per-device limit's, an unknown one).
        name = cut(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out or "(top level)"


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The config object a field holds (`MpsConfig | None` -> MpsConfig), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The object whose fields are allowed at `loc` (a path of field names)."""
    cur: type[BaseModel] | None = model
    for part in loc:
        field = cur.model_fields.get(part) if cur is not None and isinstance(part, str) else None
        if field is None:
            return None
        cur = _submodel(field.annotation)
    return cur


def _homes(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every field name of the API -> the object it belongs under ("mpsConfig" ->
    "sharing"), for a field written at the wrong level."""
    out: dict[str, str] = {}
    for name, field in model.model_fields.items():
        out.setdefault(name, prefix or "the top level")
        sub = _submodel(field.annotation)
        if sub is not None:
            for k, v in _homes(sub, f"{prefix}.{name}" if prefix else name).items():
                out.setdefault(k, v)
    return out


def _unknown_field(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """ "unknown field" with what is allowed there and the field it most likely means."""
    name = str(loc[-1]) if loc else ""
    here = _model_at(model, loc[:-1])
    if here is None:
        return "unknown field"
    allowed = list(here.model_fields)
    hint = did_you_mean(name, allowed)
    if not hint:
        home = _homes(model).get(name)
        where = ".".join(str(p) for p in loc[:-1]) or "the top level"
        if home is not None and home != where:
            hint = f"; {name} belongs under {home}"
    return f"unknown field{hint} (allowed here: {', '.join(allowed)})"


def _literal(model: type[BaseModel], loc: tuple[int | str, ...], value: Any) -> str:
    """ "; did you mean MPS?" for a value spelt in another case or slightly wrong."""
    here = _model_at(model, loc[:-1])
    field = here.model_fields.get(str(loc[-1])) if here is not None and loc else None
    if field is None or not isinstance(value, str):
        return ""
    choices = [a for a in _literals(field.annotation) if isinstance(a, str)]
    return did_you_mean(value, choices)


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [x for a in typing.get_args(annotation) for x in _literals(a)]


def _field_infos(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[FieldInfo]:
    """The declarations of the field at `loc` or holding it (a per-device limit's key is
    in the dict field's), with those of the types it is annotated with."""
    for end in range(len(loc), 0, -1):
        here = _model_at(model, loc[: end - 1])
        field = here.model_fields.get(str(loc[end - 1])) if here is not None else None
        if field is not None:
            return [field, *_annotated_infos(field.annotation)]
    return []


def _annotated_infos(annotation: Any) -> list[FieldInfo]:
    out = []
    if typing.get_origin(annotation) is Annotated:
        out += [a for a in typing.get_args(annotation)[1:] if isinstance(a, FieldInfo)]
    for arg in typing.get_args(annotation):
        out += _annotated_infos(arg)
    return out


def _whole_number(infos: list[FieldInfo]) -> str:
    """ "a whole number from 1 to 100", with the field's bounds where it has them."""
    metadata = [m for info in infos for m in info.metadata]
    # pydantic keeps Field(ge=, le=) as annotated_types' Ge and Le, each with one attribute.
    ge = next((m.ge for m in metadata if hasattr(m, "ge")), None)
    le = next((m.le for m in metadata if hasattr(m, "le")), None)
    return "a whole number" + (f" from {ge} to {le}" if ge is not None and le is not None else "")


def _wrong_type(
    model: type[BaseModel], loc: tuple[int | str, ...], *, kind: str, value: Any
) -> str:
    """What to write instead of a value of the wrong type, for the type it has: strict
    decoding refuses "50", 50.0 and true alike, but each is a different slip."""
    got = f"got {echo(value)}"
    infos = _field_infos(model, loc)
    if kind in ("int_type", "int_from_float"):
        whole = _whole_number(infos)
        if isinstance(value, bool):
            return f"{got}: true and false are not numbers; write {whole}"
        if isinstance(value, float) and value.is_integer():
            return f"{got}: write {whole}, {int(value)} rather than {value}"
        if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            return f"{got}: write the number itself, unquoted"
        return f"{got}: write {whole}"
    if kind == "string_type":
        quantity = next((i.description for i in infos if i.description), None)
        if quantity is None:
            return f"{got}: write a string, quoted where it looks like a number or true/false"
        if isinstance(value, bool):
            return f"{got}: true and false are not quantities; write {quantity}"
        if isinstance(value, int):
            return f"{got}: write {quantity}, or a number of bytes in quotes"
        return f"{got}: write {quantity}"
    if kind == "bool_type":
        return f"{got}: write true or false, unquoted"
    return f"{got}: write an object of key: value pairs"


def refusal(model: type[BaseModel], exc: ValidationError, where: str) -> str:
    """Each problem of `exc` at its path under `where`, with what fits there; at most
    MAX_PROBLEMS of them, the rest counted."""
    problems = []
    errors = exc.errors()
    for e in errors[:MAX_PROBLEMS]:
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(model, e["loc"])
        elif e["type"] == "literal_error":
            hint = _literal(model, e["loc"], e.get("input"))
            msg = f"{msg} (got {echo(e.get('input'))}{hint})"
        elif e["type"] in STRICT_TYPES:
            hint = _wrong_type(model, e["loc"], kind=e["type"], value=e.get("input"))
            msg = f"{msg} ({hint})"
        problems.append(f"{where}.{_path(e['loc'])}: {msg}" if e["loc"] else f"{where}: {msg}")
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(problems)
