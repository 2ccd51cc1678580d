"""CDI device resolution for the kubelet simulator, done the way a container runtime does it.

containerd and CRI-O resolve the CDI device IDs a DRA plugin returns with the Go library
tags.cncf.io/container-device-interface/pkg/cdi: they load every spec file in the spec
directories, drop invalid ones (a device in a dropped spec is then "unresolvable"), and
fail the container when an ID does not resolve. Two implementations live here:

* `PythonResolver` re-implements that library's loading, validation and edit merging
  (v1.1.2), so the simulator needs nothing but Python;
* `ReferenceResolver` runs tools/cdi's `cdi-resolve`, a thin command over the library
  itself, and is what `default_resolver` picks whenever it has been built, so the
  simulator fails exactly where a real runtime would. The tests run both over the same
  specs to keep the Python one honest.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from dradriver.logs import get_logger

log = get_logger("kubeletsim.cdi")

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "tools" / "cdi" / "build.sh"
TOOL_ENV = "DRADRIVER_CDI_TOOL"
TOOL_NAME = "cdi-resolve"

# Spec versions the library knows, newest first as it lists them. 0.1.0 and 0.2.0 are
# known but always rejected: every spec needs at least 0.3.0.
KNOWN_VERSIONS = (
    "1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0",
)  # fmt: skip
EARLIEST_VERSION = "0.3.0"

# OCI hook stages in the order the OCI spec lists them; injected hooks end up grouped by
# stage, so this is the order a runtime runs them in.
HOOK_STAGES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerEdits:
    """What CDI injection does to a container, as seen in its OCI spec.

    device_nodes: {path, type, major, minor, fileMode, uid, gid} (fileMode/uid/gid may be
    None); mounts: {hostPath, containerPath, options, type}; hooks: {hookName, path, args,
    env, timeout}, grouped by stage in HOOK_STAGES order.
    """

    env: tuple[str, ...] = ()
    device_nodes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    hooks: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "env": list(self.env),
            "deviceNodes": [dict(d) for d in self.device_nodes],
            "mounts": [dict(m) for m in self.mounts],
            "hooks": [dict(h) for h in self.hooks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContainerEdits:
        return cls(
            env=tuple(data.get("env") or ()),
            device_nodes=tuple(data.get("deviceNodes") or ()),
            mounts=tuple(data.get("mounts") or ()),
            hooks=tuple(data.get("hooks") or ()),
        )

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """`other` applied on top of these edits, with the library's rules: an env entry
        replaces the one with the same name in place; a device node or mount replaces the
        one with the same path (moving to the end); mounts are then stably sorted by depth
        so parents mount before children; hooks append within their stage."""
        nodes = list(self.device_nodes)
        for node in other.device_nodes:
            nodes = [n for n in nodes if n["path"] != node["path"]] + [dict(node)]
        mounts = list(self.mounts)
        for mount in other.mounts:
            mounts = [m for m in mounts if m["containerPath"] != mount["containerPath"]]
            mounts.append(dict(mount))
        mounts.sort(key=lambda m: _go_clean(m["containerPath"]).count("/"))
        hooks = sorted([*self.hooks, *other.hooks], key=lambda h: HOOK_STAGES.index(h["hookName"]))
        return ContainerEdits(
            env=tuple(merge_env(self.env, other.env)),
            device_nodes=tuple(nodes),
            mounts=tuple(mounts),
            hooks=tuple(hooks),
        )


def merge_env(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Adds `extra` ("K=V") to `base` the way the CDI library edits a process's env: a
    variable already present is overwritten where it stands, a new one is appended."""
    env = list(base)
    index = {kv.partition("=")[0]: i for i, kv in enumerate(env)}
    for kv in extra:
        key = kv.partition("=")[0]
        if key in index:
            env[index[key]] = kv
        else:
            index[key] = len(env)
            env.append(kv)
    return env


class CDIError(Exception):
    """CDI injection failed, so a runtime would not start the container. The message is
    containerd's, followed by one "CDI spec error: PATH: ERROR" line per rejected spec."""


class Resolver(Protocol):
    def validate(self, spec_dirs: Sequence[Path]) -> list[str]:
        """One "PATH: ERROR" message per invalid spec file; empty when all are valid."""
        ...

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits:
        """The edits for `device_ids`, applied in order; raises CDIError."""
        ...


def _injection_error(reason: str, spec_errors: list[str]) -> CDIError:
    lines = [f"CDI device injection failed: {reason}"]
    lines += [f"CDI spec error: {e}" for e in spec_errors]
    return CDIError("\n".join(lines))


# -- decoding spec files into the library's Go types -----------------------------------------

# The Go structs (specs-go v1.1.1) by their YAML keys. Specs are decoded strictly, as the
# library does with KnownFields(true), and with its Go decoder's scalar rules, so a spec
# that loads here loads there with the same values.
_STRUCTS: dict[str, dict[str, str]] = {
    "specs.Spec": {
        "cdiVersion": "string",
        "kind": "string",
        "annotations": "map[string]string",
        "devices": "[]specs.Device",
        "containerEdits": "specs.ContainerEdits",
    },
    "specs.Device": {
        "name": "string",
        "annotations": "map[string]string",
        "containerEdits": "specs.ContainerEdits",
    },
    "specs.ContainerEdits": {
        "env": "[]string",
        "deviceNodes": "[]*specs.DeviceNode",
        "netDevices": "[]*specs.LinuxNetDevice",
        "hooks": "[]*specs.Hook",
        "mounts": "[]*specs.Mount",
        "intelRdt": "*specs.IntelRdt",
        "additionalGids": "[]uint32",
    },
    "specs.DeviceNode": {
        "path": "string",
        "hostPath": "string",
        "type": "string",
        "major": "int64",
        "minor": "int64",
        "fileMode": "*os.FileMode",
        "permissions": "string",
        "uid": "*uint32",
        "gid": "*uint32",
    },
    "specs.Mount": {
        "hostPath": "string",
        "containerPath": "string",
        "options": "[]string",
        "type": "string",
    },
    "specs.Hook": {
        "hookName": "string",
        "path": "string",
        "args": "[]string",
        "env": "[]string",
        "timeout": "*int",
    },
    "specs.IntelRdt": {
        "closID": "string",
        "l3CacheSchema": "string",
        "memBwSchema": "string",
        "schemata": "[]string",
        "enableMonitoring": "bool",
    },
    "specs.LinuxNetDevice": {"hostInterfaceName": "string", "name": "string"},
}
_INT_RANGES = {
    "int64": (-(2**63), 2**63 - 1),
    "int": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "os.FileMode": (0, 2**32 - 1),
}
_NULLS = ("", "~", "null", "Null", "NULL")
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
# YAML 1.1 booleans, which the Go decoder still accepts for a bool-typed field.
_LEGACY_BOOLS = dict.fromkeys(["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"], True)
_LEGACY_BOOLS.update(dict.fromkeys(["n", "N", "no", "No", "NO", "off", "Off", "OFF"], False))
_GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def _go_int(text: str) -> int | float | None:
    """A plain scalar as the Go YAML decoder resolves a number (strconv base 0, so 0777
    is octal, then floats); None if it is not a number."""
    plain = text.replace("_", "")
    if _GO_INT.fullmatch(plain):
        sign = -1 if plain.startswith("-") else 1
        digits = plain.lstrip("+-")
        if digits[:2].lower() in ("0x", "0o", "0b"):
            return sign * int(digits, 0)
        return sign * int(digits, 8 if digits.startswith("0") else 10)
    if _YAML_FLOAT.fullmatch(plain):
        return float(plain)
    return None


class _Decoder:
    """Decodes a PyYAML node tree into plain values shaped like the Go structs: a struct
    is a dict holding every field (missing ones at their Go zero value), a nil pointer,
    slice or map is None. Type errors are collected like the Go decoder's."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def _fail(self, node: yaml.Node, msg: str) -> None:
        self.errors.append(f"line {node.start_mark.line + 1}: {msg}")

    def _type_error(self, node: yaml.Node, typ: str) -> None:
        if isinstance(node, yaml.ScalarNode):
            value = node.value if len(node.value) <= 10 else node.value[:7] + "..."
            self._fail(node, f"cannot unmarshal {_scalar_tag(node)} `{value}` into {typ}")
        else:
            kind = "!!seq" if isinstance(node, yaml.SequenceNode) else "!!map"
            self._fail(node, f"cannot unmarshal {kind} into {typ}")

    def zero(self, typ: str) -> Any:
        if typ in _STRUCTS:
            return {key: self.zero(t) for key, t in _STRUCTS[typ].items()}
        return {"string": "", "bool": False}.get(typ, 0 if typ in _INT_RANGES else None)

    def decode(self, node: yaml.Node, typ: str) -> Any:
        if _is_null(node):
            return self.zero(typ)
        if typ.startswith("*"):
            return self.decode(node, typ[1:])
        if typ.startswith("[]"):
            if not isinstance(node, yaml.SequenceNode):
                self._type_error(node, typ)
                return None
            return [self.decode(item, typ[2:]) for item in node.value]
        if typ == "map[string]string" or typ in _STRUCTS:
            return self._mapping(node, typ)
        if not isinstance(node, yaml.ScalarNode):
            self._type_error(node, typ)
            return self.zero(typ)
        return self._scalar(node, typ)

    def _mapping(self, node: yaml.Node, typ: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            self._type_error(node, typ)
            return self.zero(typ)
        fields = _STRUCTS.get(typ)
        out: dict[str, Any] = self.zero(typ) if fields else {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                self._fail(key_node, f'mapping key "{key}" already defined at line {seen[key]}')
                continue
            seen[key] = line
            if fields is None:
                out[key] = self.decode(value_node, "string")
            elif key not in fields:
                self._fail(key_node, f"field {key} not found in type {typ}")
            else:
                out[key] = self.decode(value_node, fields[key])
        return out

    def _scalar(self, node: yaml.ScalarNode, typ: str) -> Any:
        text: str = node.value
        quoted = node.style is not None
        if typ == "string":
            return text  # Go's decoder takes any scalar's text for a string field
        if typ == "bool":
            if not quoted and text in _BOOLS:
                return _BOOLS[text]
            if text in _LEGACY_BOOLS:
                return _LEGACY_BOOLS[text]
        elif typ in _INT_RANGES and not quoted:
            number = _go_int(text)
            lo, hi = _INT_RANGES[typ]
            if number is not None and lo <= number <= hi:
                return int(number)  # a float truncates toward zero, as in Go
        self._type_error(node, typ)
        return self.zero(typ)


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.style is None and node.value in _NULLS


def _scalar_tag(node: yaml.ScalarNode) -> str:
    if node.style is not None:
        return "!!str"
    if node.value in _NULLS:
        return "!!null"
    if node.value in _BOOLS:
        return "!!bool"
    number = _go_int(node.value)
    if isinstance(number, int):
        return "!!int"
    return "!!float" if number is not None else "!!str"


def _parse(data: bytes) -> Any:
    """The first YAML document decoded into a specs.Spec, or None for a null document.
    Raises ValueError with the decoder's message."""
    text = data.decode("utf-8", errors="replace")
    try:
        # JSON is YAML, and the Go library reads .json files with its YAML decoder. In
        # valid JSON every literal tab is whitespace, which Go's decoder skips inside
        # flow collections but PyYAML does not.
        json.loads(text)
        text = text.replace("\t", " ")
    except ValueError:
        pass
    try:
        root = next(iter(yaml.compose_all(text)), None)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}: " if mark else ""
        raise ValueError(f"yaml: {line}{exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"yaml: {exc}") from None
    if root is None:
        raise ValueError("EOF")
    if _is_null(root):
        return None
    decoder = _Decoder()
    spec = decoder.decode(root, "specs.Spec")
    if decoder.errors:
        raise ValueError("yaml: unmarshal errors: " + " ".join(decoder.errors))
    return spec


# -- validation, as the library's newSpec/validate does it -----------------------------------


class _Invalid(Exception):
    pass


def _q(s: str) -> str:
    """Go's %q, near enough for messages."""
    return json.dumps(s, ensure_ascii=False)


def _go_clean(path: str) -> str:
    """Go's filepath.Clean: like normpath, but POSIX's special "//" prefix is not kept."""
    cleaned = posixpath.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _is_letter(c: str) -> bool:
    return "a" <= c <= "z" or "A" <= c <= "Z"


def _is_alnum(c: str) -> bool:
    return _is_letter(c) or "0" <= c <= "9"


def _validate_vendor_or_class(name: str) -> str | None:
    # Like the library: first and last *bytes*, inner characters.
    raw = name.encode()
    if not raw:
        return "empty name"
    if not _is_letter(chr(raw[0])):
        return f"{_q(name)}, should start with letter"
    if len(raw) == 1:
        return None
    for c in raw[1:-1].decode(errors="replace"):
        if not (_is_alnum(c) or c in "_-."):
            return f"invalid character '{c}' in name {_q(name)}"
    if not _is_alnum(chr(raw[-1])):
        return f"{_q(name)}, should end with a letter or digit"
    return None


def _validate_device_name(name: str) -> None:
    raw = name.encode()
    if not raw:
        raise _Invalid("invalid (empty) device name")
    if not _is_alnum(chr(raw[0])):
        # sic: the library says "class" here
        raise _Invalid(f"invalid class {_q(name)}, should start with a letter or digit")
    if len(raw) == 1:
        return
    for c in raw[1:-1].decode(errors="replace"):
        if not (_is_alnum(c) or c in "_-.:"):
            raise _Invalid(f"invalid character '{c}' in device name {_q(name)}")
    if not _is_alnum(chr(raw[-1])):
        raise _Invalid(f"invalid name {_q(name)}, should end with a letter or digit")


def _parse_qualifier(kind: str) -> tuple[str, str]:
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        return "", kind
    return vendor, cls


def _all_edits(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [d["containerEdits"] for d in spec["devices"] or []] + [spec["containerEdits"]]


def _required_version(spec: dict[str, Any]) -> str:
    """The lowest spec version that can express this spec's content."""
    edits = _all_edits(spec)
    if any(
        (
            e["intelRdt"]
            and (e["intelRdt"]["schemata"] is not None or e["intelRdt"]["enableMonitoring"])
        )
        or e["netDevices"]
        for e in edits
    ):
        return "1.1.0"
    if any(e["intelRdt"] is not None or e["additionalGids"] for e in edits):
        return "0.7.0"
    devices = spec["devices"] or []
    if spec["annotations"] or any(d["annotations"] for d in devices):
        return "0.6.0"
    if "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    if any(d["name"][:1].isdigit() and d["name"][:1].isascii() for d in devices):
        return "0.5.0"
    if any(n and n["hostPath"] for e in edits for n in e["deviceNodes"] or []):
        return "0.5.0"
    if any(m and m["type"] for e in edits for m in e["mounts"] or []):
        return "0.4.0"
    return EARLIEST_VERSION


def _validate_env(env: list[str] | None) -> None:
    for kv in env or []:
        if kv.find("=") <= 0:
            raise _Invalid(f"invalid environment variable {_q(kv)}")


def _validate_edits(edits: dict[str, Any]) -> None:
    try:
        _validate_env(edits["env"])
    except _Invalid as exc:
        raise _Invalid(f"invalid container edits: {exc}") from None
    for node in edits["deviceNodes"] or []:
        if node is None:
            raise _Invalid("invalid (nil) device node")
        path = node["path"]
        if not path:
            raise _Invalid("invalid (empty) device path")
        if node["type"] not in ("", "b", "c", "u", "p"):
            raise _Invalid(f"device {_q(path)}: invalid type {_q(node['type'])}")
        if node["major"] < 0 or node["minor"] < 0:
            raise _Invalid(
                f"device {_q(path)}: invalid (negative) device number "
                f"{node['major']}:{node['minor']}"
            )
        perms = node["permissions"]
        if perms not in ("", "none") and perms.strip("rwm"):
            raise _Invalid(f"device {_q(path)}: invalid permissions {_q(perms)}")
    for hook in edits["hooks"] or []:
        if hook is None:
            raise _Invalid("invalid (nil) hook")
        if hook["hookName"] not in HOOK_STAGES:
            raise _Invalid(f"invalid hook name {_q(hook['hookName'])}")
        if not hook["path"]:
            raise _Invalid(f"invalid hook {_q(hook['hookName'])} with empty path")
        try:
            _validate_env(hook["env"])
        except _Invalid as exc:
            raise _Invalid(f"invalid hook {_q(hook['hookName'])}: {exc}") from None
    for mount in edits["mounts"] or []:
        if mount is None:
            raise _Invalid("invalid (nil) mount")
        if not mount["hostPath"]:
            raise _Invalid("invalid mount, empty host path")
        if not mount["containerPath"]:
            raise _Invalid("invalid mount, empty container path")
    rdt = edits["intelRdt"]
    if rdt is not None:
        clos = rdt["closID"]
        if clos != "/" and (
            len(clos) >= 4096 or clos in (".", "..") or any(c in clos for c in "/\n")
        ):
            raise _Invalid("invalid ClosID")
    hosts: dict[str, str] = {}
    names: dict[str, str] = {}
    for dev in edits["netDevices"] or []:
        if dev is None:
            raise _Invalid("invalid (nil) linux net device")
        host, name = dev["hostInterfaceName"], dev["name"]
        if not host:
            raise _Invalid("invalid linux net device, empty HostInterfaceName")
        if not name:
            raise _Invalid("invalid linux net device, empty Name")
        if host in hosts:
            raise _Invalid(
                f"invalid linux net device, duplicate HostInterfaceName {_q(host)} "
                f"with names {_q(name)} and {_q(hosts[host])}"
            )
        hosts[host] = name
        if name in names:
            raise _Invalid(
                f"invalid linux net device, duplicate Name {_q(name)} "
                f"with HostInterfaceName {_q(host)} and {_q(names[name])}"
            )
        names[name] = host


def _edits_empty(edits: dict[str, Any]) -> bool:
    keys = ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices")
    return not any(edits[k] for k in keys) and edits["intelRdt"] is None


@dataclass
class _Spec:
    path: str
    priority: int
    raw: dict[str, Any]
    vendor: str
    cls: str
    devices: dict[str, dict[str, Any]]


def _validate_spec(raw: dict[str, Any], path: str, priority: int) -> _Spec:
    version = raw["cdiVersion"].removeprefix("v")
    if version not in KNOWN_VERSIONS:
        raise _Invalid(f"invalid version {_q(raw['cdiVersion'])}")
    required = _required_version(raw)
    if KNOWN_VERSIONS.index(required) < KNOWN_VERSIONS.index(version):
        raise _Invalid(f"the spec version must be at least v{required}")
    vendor, cls = _parse_qualifier(raw["kind"])
    if err := _validate_vendor_or_class(vendor):
        raise _Invalid(f"invalid vendor. {err}")
    if err := _validate_vendor_or_class(cls):
        raise _Invalid(f"invalid class. {err}")
    # Annotations are not checked: the library's check never fires for specs-go's
    # map[string]string, so neither do we.
    _validate_edits(raw["containerEdits"])
    devices: dict[str, dict[str, Any]] = {}
    for dev in raw["devices"] or []:
        name = dev["name"]
        try:
            _validate_device_name(name)
            if _edits_empty(dev["containerEdits"]):
                raise _Invalid("invalid device, empty device edits")
            try:
                _validate_edits(dev["containerEdits"])
            except _Invalid as exc:
                raise _Invalid(f"invalid device {_q(name)}: {exc}") from None
        except _Invalid as exc:
            raise _Invalid(f"failed add device {_q(name)}: {exc}") from None
        if name in devices:
            raise _Invalid(f"invalid spec, multiple device {_q(name)}")
        devices[name] = dev
    if not devices:
        raise _Invalid("invalid spec, no devices")
    return _Spec(path, priority, raw, vendor, cls, devices)


def _read_spec(path: str, priority: int) -> _Spec:
    """Reads and validates one spec file; raises _Invalid with the library's message."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise _Invalid(f"open {path}: {_errno_text(exc)}") from None
    except OSError as exc:
        raise _Invalid(
            f"failed to read CDI Spec {_q(path)}: read {path}: {_errno_text(exc)}"
        ) from None
    try:
        raw = _parse(data)
    except ValueError as exc:
        raise _Invalid(
            f"failed to parse CDI Spec {_q(path)}: failed to unmarshal CDI Spec: {exc}"
        ) from None
    if raw is None:
        raise _Invalid(f"failed to parse CDI Spec {_q(path)}, no Spec data")
    try:
        return _validate_spec(raw, path, priority)
    except _Invalid as exc:
        raise _Invalid(f"invalid CDI Spec: {exc}") from None


def _errno_text(exc: OSError) -> str:
    # Go's syscall messages are the C library's with a lower-case first letter.
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _go_ext(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:] if dot >= 0 else ""


@dataclass
class _Registry:
    """One scan of the spec directories, as the library's Cache.refresh does it."""

    devices: dict[str, tuple[_Spec, dict[str, Any]]]
    errors: dict[str, list[str]]

    def error_lines(self) -> list[str]:
        return [f"{path}: {'; '.join(errs)}" for path, errs in sorted(self.errors.items())]


def _scan(spec_dirs: Sequence[Path]) -> _Registry:
    devices: dict[str, tuple[_Spec, dict[str, Any]]] = {}
    errors: dict[str, list[str]] = {}
    conflicts: set[str] = set()
    dirs = [_go_clean(str(d)) for d in spec_dirs]
    for priority, spec_dir in enumerate(dirs):
        try:
            entries = sorted(os.scandir(spec_dir), key=lambda e: e.name.encode())
        except FileNotFoundError:
            continue
        except OSError:
            break  # the library gives up on the whole scan at an unreadable directory
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) or _go_ext(entry.name) not in (".json", ".yaml"):
                continue
            path = posixpath.join(spec_dir, entry.name)
            try:
                spec = _read_spec(path, priority)
            except _Invalid as exc:
                errors.setdefault(path, []).append(f"failed to load CDI Spec {exc}")
                continue
            for name, dev in spec.devices.items():
                qualified = f"{spec.vendor}/{spec.cls}={name}"
                if qualified in devices:
                    other = devices[qualified][0]
                    if other.priority == priority:
                        msg = (
                            f"conflicting device {_q(qualified)} "
                            f"(specs {_q(path)}, {_q(other.path)})"
                        )
                        errors.setdefault(path, []).append(msg)
                        errors.setdefault(other.path, []).append(msg)
                        conflicts.add(qualified)
                        continue
                devices[qualified] = (spec, dev)
    # A conflicted name is dropped even if a higher-priority directory also defines it.
    for name in conflicts:
        devices.pop(name, None)
    return _Registry(devices, errors)


# -- applying edits ----------------------------------------------------------------------------


def _oci_device(node: dict[str, Any]) -> dict[str, Any]:
    """A CDI device node as it lands in the OCI spec: what the spec leaves out (type,
    numbers, mode) is read from the host device, as the library's fillMissingInfo does."""
    dev_type, major, minor, mode = node["type"], node["major"], node["minor"], node["fileMode"]
    host_path = node["hostPath"] or node["path"]
    # With a type and a major number (or a FIFO) the host device need not exist.
    minimal = dev_type != "" and (major != 0 or dev_type == "p")
    try:
        st = os.lstat(host_path)
        kinds = {stat.S_IFBLK: "b", stat.S_IFCHR: "c", stat.S_IFIFO: "p"}
        host_type = kinds.get(stat.S_IFMT(st.st_mode))
        if host_type is None:
            raise _Invalid("not a device node")
    except (OSError, _Invalid) as exc:
        if not minimal:
            reason = _errno_text(exc) if isinstance(exc, OSError) else str(exc)
            raise _Invalid(f"failed to stat CDI host device {_q(host_path)}: {reason}") from None
    else:
        if mode is None:
            mode = st.st_mode & ~stat.S_IFMT(st.st_mode)
        if not minimal:
            dev_type = dev_type or host_type
            if dev_type != host_type:
                raise _Invalid(
                    f"CDI device ({_q(node['path'])}, {_q(host_path)}), host type mismatch "
                    f"({dev_type}, {host_type})"
                )
            if dev_type != "p" and major == 0:
                major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    # uid/gid would default to the process user's when non-zero; the simulated process
    # runs as root, as the reference tool's OCI spec does.
    return {
        "path": node["path"],
        "type": dev_type,
        "major": major,
        "minor": minor,
        "fileMode": mode,
        "uid": node["uid"],
        "gid": node["gid"],
    }


def _to_edits(raw: dict[str, Any]) -> ContainerEdits:
    return ContainerEdits(
        env=tuple(raw["env"] or ()),
        device_nodes=tuple(_oci_device(n) for n in raw["deviceNodes"] or []),
        mounts=tuple(
            {
                "hostPath": m["hostPath"],
                "containerPath": m["containerPath"],
                "options": list(m["options"] or []),
                "type": m["type"],
            }
            for m in raw["mounts"] or []
        ),
        hooks=tuple(
            {
                "hookName": h["hookName"],
                "path": h["path"],
                "args": list(h["args"] or []),
                "env": list(h["env"] or []),
                "timeout": h["timeout"],
            }
            for h in raw["hooks"] or []
        ),
    )


# -- resolvers ---------------------------------------------------------------------------------


class PythonResolver:
    """The CDI library's behaviour (v1.1.2) in Python; see the module docstring."""

    def __init__(self) -> None:
        self._warned: set[str] = set()  # each rejected spec is logged once, not per pod

    def validate(self, spec_dirs: Sequence[Path]) -> list[str]:
        return _scan(spec_dirs).error_lines()

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits:
        if not device_ids:
            return ContainerEdits()
        registry = _scan(spec_dirs)
        spec_errors = registry.error_lines()
        for line in set(spec_errors) - self._warned:
            # containerd logs a failed refresh and carries on: a rejected spec only
            # matters if a requested device was in it.
            log.warning("CDI spec rejected", error=line)
            self._warned.add(line)
        unresolved = [i for i in device_ids if i not in registry.devices]
        if unresolved:
            raise _injection_error(f"unresolvable CDI devices {', '.join(unresolved)}", spec_errors)
        # A spec's own edits go in once, just before its first requested device's.
        raw_edits: list[dict[str, Any]] = []
        seen: set[str] = set()
        for device_id in device_ids:
            spec, dev = registry.devices[device_id]
            if spec.path not in seen:
                seen.add(spec.path)
                raw_edits.append(spec.raw["containerEdits"])
            raw_edits.append(dev["containerEdits"])
        edits = ContainerEdits()
        try:
            for raw in raw_edits:
                edits = edits.merged(_to_edits(raw))
        except _Invalid as exc:
            raise _injection_error(f"failed to inject devices: {exc}", spec_errors) from None
        return edits


class ReferenceResolver:
    """Runs tools/cdi's cdi-resolve, i.e. the CDI library containerd and CRI-O use."""

    def __init__(self, binary: Path, timeout: float = 60.0) -> None:
        self.binary = Path(binary)
        self.timeout = timeout

    def _run(self, spec_dirs: Sequence[Path], args: list[str]) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *(f"--spec-dir={d}" for d in spec_dirs), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def validate(self, spec_dirs: Sequence[Path]) -> list[str]:
        if not spec_dirs:
            return []
        proc = self._run(spec_dirs, ["validate"])
        return proc.stderr.splitlines() if proc.returncode else []

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits:
        if not device_ids:
            return ContainerEdits()
        if not spec_dirs:
            raise _injection_error(f"unresolvable CDI devices {', '.join(device_ids)}", [])
        proc = self._run(spec_dirs, ["resolve", *device_ids])
        if proc.returncode:
            raise CDIError(proc.stderr.strip())
        return ContainerEdits.from_json(json.loads(proc.stdout))


def cache_dir() -> Path:
    """Where tools/*/build.sh put their builds (DRADRIVER_CACHE, else the XDG cache)."""
    if root := os.environ.get("DRADRIVER_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "dradriver"


def find_cached_tool() -> Path | None:
    """The newest complete cdi-resolve build in the cache, without building or running
    anything (the key depends on `go version`, which is too slow to ask every time)."""
    builds = [
        d / TOOL_NAME
        for d in (cache_dir() / "cdi").glob("*")
        if (d / ".complete").is_file() and os.access(d / TOOL_NAME, os.X_OK)
    ]
    return max(builds, key=lambda p: (p.parent / ".complete").stat().st_mtime, default=None)


def build_reference_tool() -> Path:
    """Builds cdi-resolve with tools/cdi/build.sh (or finds the cached build) and returns
    the binary's path; progress goes to stderr. Needs Go."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(
            f"building {TOOL_NAME} with {BUILD_SCRIPT} failed (exit {proc.returncode})"
        )
    return Path(proc.stdout.strip().splitlines()[-1]) / TOOL_NAME


def default_resolver(prefer_reference: bool = True) -> Resolver:
    """The Go reference resolver if $DRADRIVER_CDI_TOOL names it (the binary or its
    directory) or a complete build is cached, else the Python one."""
    if prefer_reference:
        if named := os.environ.get(TOOL_ENV):
            tool = Path(named)
            tool = tool / TOOL_NAME if tool.is_dir() else tool
            if not os.access(tool, os.X_OK):
                raise FileNotFoundError(f"${TOOL_ENV}={named}: no executable {TOOL_NAME} there")
            return ReferenceResolver(tool)
        if cached := find_cached_tool():
            return ReferenceResolver(cached)
    return PythonResolver()
