"""CDI resolution for the kubelet simulator: PythonResolver and, when Go is installed,
the reference resolver (tools/cdi, the library containerd and CRI-O use) over the same
spec files. Valid specs must give identical edits, invalid ones must fail in both."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.dev.kubeletsim.cdi import (
    CDIError,
    ContainerEdits,
    PythonResolver,
    ReferenceResolver,
    Resolver,
    build_reference_tool,
    default_resolver,
    merge_env,
)

KIND = "gpu.dradriver.io/claim"
CLAIM = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"
GPU0 = f"{KIND}={CLAIM}-gpu-0"
GPU1 = f"{KIND}={CLAIM}-gpu-1"


def spec(
    *devices: dict[str, Any], version: str = "0.5.0", kind: str = KIND, **top: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"cdiVersion": version, "kind": kind, "devices": list(devices)}
    if top:
        out["containerEdits"] = top
    return out


def dev(name: str, **edits: Any) -> dict[str, Any]:
    return {"name": name, "containerEdits": edits}


def write(directory: Path, name: str, content: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        text = content
    elif name.endswith(".json"):
        text = json.dumps(content, indent=2)
    else:
        text = yaml.safe_dump(content, sort_keys=False)
    path = directory / name
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def reference_binary() -> Path:
    if shutil.which("go") is None:
        pytest.skip(
            "go is not installed, so tools/cdi (the CDI reference resolver) cannot be built"
        )
    return build_reference_tool()


@pytest.fixture(params=["python", "reference"])
def resolver(request: pytest.FixtureRequest) -> Resolver:
    if request.param == "python":
        return PythonResolver()
    return ReferenceResolver(request.getfixturevalue("reference_binary"))


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    return tmp_path / "cdi"


def null_device() -> dict[str, Any]:
    """/dev/null as the host shows it: a stand-in for a GPU device node that exists."""
    st = os.lstat("/dev/null")
    return {
        "type": "c",
        "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev),
        "fileMode": stat.S_IMODE(st.st_mode),
    }


# -- valid specs ---------------------------------------------------------------------------


def test_env_only_spec(resolver: Resolver, cdi_dir: Path) -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=GPU-aaaa", f"DRADRIVER_CLAIM_UID={CLAIM}"]
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=env)))
    assert resolver.validate([cdi_dir]) == []
    edits = resolver.resolve([cdi_dir], [GPU0])
    assert edits == ContainerEdits(env=tuple(env))


def test_later_env_entry_overrides_in_place(resolver: Resolver, cdi_dir: Path) -> None:
    write(
        cdi_dir,
        "claim.yaml",
        spec(
            dev(f"{CLAIM}-gpu-0", env=["A=dev", "C=dev", "A=dev2"]),
            dev(f"{CLAIM}-gpu-1", env=["B=gpu1"]),
            env=["A=top", "B=top"],
        ),
    )
    # The library overwrites a variable where it first appeared; it does not move it.
    assert resolver.resolve([cdi_dir], [GPU0, GPU1]).env == ("A=dev2", "B=gpu1", "C=dev")


def test_device_nodes(resolver: Resolver, cdi_dir: Path) -> None:
    write(
        cdi_dir,
        "claim.yaml",
        spec(
            dev(
                f"{CLAIM}-gpu-0",
                deviceNodes=[
                    # Type and major given: the host node need not exist.
                    {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                    # Only a host path: type, numbers and mode come from the host.
                    {"path": "/dev/nvidiactl", "hostPath": "/dev/null"},
                ],
            ),
            dev(
                f"{CLAIM}-gpu-1",
                deviceNodes=[
                    {
                        "path": "/dev/nvidia0",
                        "type": "c",
                        "major": 195,
                        "minor": 1,
                        "fileMode": 0o660,
                        "uid": 0,
                        "gid": 44,
                    }
                ],
            ),
        ),
    )
    null = null_device()
    edits = resolver.resolve([cdi_dir], [GPU0, GPU1])
    assert edits.device_nodes == (
        {"path": "/dev/nvidiactl", **null, "uid": None, "gid": None},
        # Same path again: the later node replaces the earlier one and moves to the end.
        {
            "path": "/dev/nvidia0",
            "type": "c",
            "major": 195,
            "minor": 1,
            "fileMode": 0o660,
            "uid": 0,
            "gid": 44,
        },
    )
    assert resolver.resolve([cdi_dir], [GPU0]).device_nodes[0] == {
        "path": "/dev/nvidia0",
        "type": "c",
        "major": 195,
        "minor": 0,
        "fileMode": None,
        "uid": None,
        "gid": None,
    }


def test_missing_host_device_fails_injection(resolver: Resolver, cdi_dir: Path) -> None:
    missing = "/dev/dradriver-test-no-such-device"
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", deviceNodes=[{"path": missing}])))
    assert resolver.validate([cdi_dir]) == []  # the spec is fine; the host is not
    with pytest.raises(CDIError) as exc:
        resolver.resolve([cdi_dir], [GPU0])
    assert str(exc.value) == (
        "CDI device injection failed: failed to inject devices: "
        f'failed to stat CDI host device "{missing}": no such file or directory'
    )


def test_mounts_sorted_by_depth_and_replaced(resolver: Resolver, cdi_dir: Path) -> None:
    libcuda = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    write(
        cdi_dir,
        "claim.yaml",
        spec(
            dev(
                f"{CLAIM}-gpu-0",
                mounts=[
                    {"hostPath": "/h/libcuda", "containerPath": libcuda, "options": ["ro", "bind"]},
                    {"hostPath": "/h/smi", "containerPath": "/usr/bin/nvidia-smi"},
                    {"hostPath": "/h/etc", "containerPath": "/etc/nvidia", "type": "bind"},
                ],
            ),
            dev(
                f"{CLAIM}-gpu-1",
                mounts=[{"hostPath": "/h2/smi", "containerPath": "/usr/bin/nvidia-smi"}],
            ),
        ),
    )
    edits = resolver.resolve([cdi_dir], [GPU0, GPU1])
    assert edits.mounts == (
        {"hostPath": "/h/etc", "containerPath": "/etc/nvidia", "options": [], "type": "bind"},
        {"hostPath": "/h2/smi", "containerPath": "/usr/bin/nvidia-smi", "options": [], "type": ""},
        {"hostPath": "/h/libcuda", "containerPath": libcuda, "options": ["ro", "bind"], "type": ""},
    )


def test_hooks_grouped_by_stage(resolver: Resolver, cdi_dir: Path) -> None:
    hooks = [
        {"hookName": "poststop", "path": "/bin/cleanup"},
        {
            "hookName": "createContainer",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "update-ldcache"],
            "env": ["DEBUG=1"],
            "timeout": 10,
        },
        {"hookName": "prestart", "path": "/bin/pre"},
        {"hookName": "createContainer", "path": "/bin/second"},
    ]
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", hooks=hooks)))
    edits = resolver.resolve([cdi_dir], [GPU0])
    assert [(h["hookName"], h["path"]) for h in edits.hooks] == [
        ("prestart", "/bin/pre"),
        ("createContainer", "/usr/bin/nvidia-cdi-hook"),
        ("createContainer", "/bin/second"),
        ("poststop", "/bin/cleanup"),
    ]
    assert edits.hooks[1] == {
        "hookName": "createContainer",
        "path": "/usr/bin/nvidia-cdi-hook",
        "args": ["nvidia-cdi-hook", "update-ldcache"],
        "env": ["DEBUG=1"],
        "timeout": 10,
    }
    assert edits.hooks[0]["args"] == [] and edits.hooks[0]["timeout"] is None


def test_spec_edits_go_in_once_before_the_specs_first_device(
    resolver: Resolver, cdi_dir: Path
) -> None:
    write(
        cdi_dir,
        "a.yaml",
        spec(
            dev("a1", env=["A1=1"]),
            dev("a2", env=["A2=1"]),
            kind="a.example.com/x",
            env=["A_TOP=1"],
        ),
    )
    write(cdi_dir, "b.json", spec(dev("b1", env=["B1=1"]), kind="b.example.com/x", env=["B_TOP=1"]))
    ids = ["a.example.com/x=a1", "b.example.com/x=b1", "a.example.com/x=a2"]
    edits = resolver.resolve([cdi_dir], ids)
    assert edits.env == ("A_TOP=1", "A1=1", "B_TOP=1", "B1=1", "A2=1")


def test_go_scalar_rules(resolver: Resolver, cdi_dir: Path) -> None:
    # An unquoted number is still a string where the Go type says string, and a
    # leading-zero number is octal, as in Go's YAML decoder.
    write(
        cdi_dir,
        "scalars.yaml",
        f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n"
        "- name: 12\n  containerEdits:\n    env: [N=1.50]\n"
        "    deviceNodes: [{path: /dev/x, type: c, major: 195, fileMode: 0660}]\n",
    )
    edits = resolver.resolve([cdi_dir], [f"{KIND}=12"])
    assert edits.env == ("N=1.50",)
    assert edits.device_nodes[0]["fileMode"] == 0o660


def test_tab_indented_json(resolver: Resolver, cdi_dir: Path) -> None:
    content = spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]))
    (cdi_dir / "claim.json").parent.mkdir(parents=True)
    (cdi_dir / "claim.json").write_text(json.dumps(content, indent="\t"))
    assert resolver.resolve([cdi_dir], [GPU0]).env == ("A=1",)


def test_only_json_and_yaml_files_are_specs(resolver: Resolver, cdi_dir: Path) -> None:
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"])))
    write(cdi_dir, "ignored.yml", "not: [a spec")
    write(cdi_dir, "ignored.txt", "garbage")
    (cdi_dir / "sub.yaml").mkdir()
    assert resolver.validate([cdi_dir]) == []


def test_later_spec_dir_wins(resolver: Resolver, tmp_path: Path) -> None:
    low, high = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    write(low, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["FROM=low"])))
    write(high, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["FROM=high"])))
    assert resolver.validate([low, high]) == []
    assert resolver.resolve([low, high], [GPU0]).env == ("FROM=high",)
    assert resolver.resolve([high, low], [GPU0]).env == ("FROM=low",)


def test_no_device_ids_means_no_edits(resolver: Resolver, cdi_dir: Path) -> None:
    assert resolver.resolve([cdi_dir], []) == ContainerEdits()


# -- invalid specs and unresolvable devices --------------------------------------------------


def test_unresolvable_id(resolver: Resolver, cdi_dir: Path) -> None:
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"])))
    with pytest.raises(CDIError) as exc:
        resolver.resolve([cdi_dir], [GPU0, f"{KIND}=abc", "not-qualified"])
    assert str(exc.value) == (
        f"CDI device injection failed: unresolvable CDI devices {KIND}=abc, not-qualified"
    )


def test_missing_spec_dir_is_empty(resolver: Resolver, tmp_path: Path) -> None:
    assert resolver.validate([tmp_path / "nope"]) == []
    with pytest.raises(CDIError, match="unresolvable CDI devices"):
        resolver.resolve([tmp_path / "nope"], [GPU0])


def assert_rejected(resolver: Resolver, cdi_dir: Path, path: Path, error: str) -> None:
    """`path` is the one invalid spec, with `error` in its message; its devices are
    unresolvable and the injection error names the file."""
    messages = resolver.validate([cdi_dir])
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}: failed to load CDI Spec "), messages[0]
    assert error in messages[0]
    with pytest.raises(CDIError) as exc:
        resolver.resolve([cdi_dir], [GPU0])
    assert str(exc.value) == (
        f"CDI device injection failed: unresolvable CDI devices {GPU0}\n"
        f"CDI spec error: {messages[0]}"
    )


def test_unknown_field(resolver: Resolver, cdi_dir: Path) -> None:
    path = write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"], bogus=True)))
    line = path.read_text().splitlines().index("    bogus: true") + 1
    assert_rejected(
        resolver,
        cdi_dir,
        path,
        "failed to unmarshal CDI Spec: yaml: unmarshal errors: "
        f"line {line}: field bogus not found in type specs.ContainerEdits",
    )


def test_unknown_top_level_field_in_json(resolver: Resolver, cdi_dir: Path) -> None:
    content = {**spec(dev(f"{CLAIM}-gpu-0", env=["A=1"])), "vendorExtra": 1}
    path = write(cdi_dir, "claim.json", content)
    assert_rejected(resolver, cdi_dir, path, "field vendorExtra not found in type specs.Spec")


def test_quoted_number_is_not_an_int(resolver: Resolver, cdi_dir: Path) -> None:
    path = write(
        cdi_dir,
        "claim.yaml",
        f"cdiVersion: 0.5.0\nkind: {KIND}\ndevices:\n- name: {CLAIM}-gpu-0\n"
        '  containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: "195"}]}\n',
    )
    assert_rejected(resolver, cdi_dir, path, "line 5: cannot unmarshal !!str `195` into int64")


@pytest.mark.parametrize("version", ["0.9.0", "2.0.0", "1.2.0", "latest"])
def test_unknown_cdi_version(resolver: Resolver, cdi_dir: Path, version: str) -> None:
    path = write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]), version=version))
    assert_rejected(resolver, cdi_dir, path, f'invalid CDI Spec: invalid version "{version}"')


@pytest.mark.parametrize(
    ("version", "content", "needed"),
    [
        # A device name starting with a digit (as claim UIDs do) needs 0.5.0.
        ("0.4.0", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"])), "0.5.0"),
        (
            "0.4.0",
            spec(dev("gpu0", deviceNodes=[{"path": "/dev/x", "hostPath": "/dev/null"}])),
            "0.5.0",
        ),
        (
            "0.3.0",
            spec(dev("gpu0", mounts=[{"hostPath": "/a", "containerPath": "/b", "type": "bind"}])),
            "0.4.0",
        ),
        ("0.5.0", {**spec(dev("gpu0", env=["A=1"])), "annotations": {"a": "b"}}, "0.6.0"),
        ("0.5.0", spec(dev("gpu0", env=["A=1"]), kind="gpu.dradriver.io/claim.v1"), "0.6.0"),
        ("0.6.0", spec(dev("gpu0", additionalGids=[44])), "0.7.0"),
        # Known to the library, but below the 0.3.0 every spec needs.
        ("0.2.0", spec(dev("gpu0", env=["A=1"])), "0.3.0"),
    ],
    ids=["digit-name", "host-path", "mount-type", "annotations", "dotted-class", "gids", "0.2.0"],
)
def test_version_too_low_for_content(
    resolver: Resolver, cdi_dir: Path, version: str, content: dict[str, Any], needed: str
) -> None:
    path = write(cdi_dir, "claim.yaml", {**content, "cdiVersion": version})
    messages = resolver.validate([cdi_dir])
    assert messages == [
        f"{path}: failed to load CDI Spec invalid CDI Spec: "
        f"the spec version must be at least v{needed}"
    ]
    # The same content at the version it needs is fine.
    write(cdi_dir, "claim.yaml", {**content, "cdiVersion": needed})
    assert resolver.validate([cdi_dir]) == []


def test_version_may_have_a_v_prefix(resolver: Resolver, cdi_dir: Path) -> None:
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]), version="v0.5.0"))
    assert resolver.resolve([cdi_dir], [GPU0]).env == ("A=1",)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("gpu.dradriver.io", "invalid vendor. empty name"),
        ("gpu.dradriver.io/", "invalid vendor. empty name"),
        ("gpu.dradriver.io/claim/x", "invalid class. invalid character '/' in name \"claim/x\""),
        ("1gpu.io/claim", 'invalid vendor. "1gpu.io", should start with letter'),
        ("gpu.dradriver.io/claim-", 'invalid class. "claim-", should end with a letter or digit'),
        ("gpu dradriver.io/claim", "invalid vendor. invalid character ' ' in name"),
    ],
)
def test_bad_kind(resolver: Resolver, cdi_dir: Path, kind: str, error: str) -> None:
    path = write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]), kind=kind))
    assert_rejected(resolver, cdi_dir, path, f"invalid CDI Spec: {error}")


@pytest.mark.parametrize(
    ("device", "error"),
    [
        (
            dev(f"{CLAIM}-gpu-0"),
            f'failed add device "{CLAIM}-gpu-0": invalid device, empty device edits',
        ),
        (dev("-gpu0", env=["A=1"]), 'invalid class "-gpu0", should start with a letter or digit'),
        (dev("gpu/0", env=["A=1"]), "invalid character '/' in device name \"gpu/0\""),
        (dev(f"{CLAIM}-gpu-0", env=["NOVALUE"]), 'invalid environment variable "NOVALUE"'),
        (
            dev(f"{CLAIM}-gpu-0", hooks=[{"hookName": "preStart", "path": "/x"}]),
            'invalid hook name "preStart"',
        ),
        (
            dev(f"{CLAIM}-gpu-0", mounts=[{"hostPath": "/a", "containerPath": ""}]),
            "empty container path",
        ),
        (
            dev(f"{CLAIM}-gpu-0", deviceNodes=[{"path": "/dev/nvidia0", "permissions": "rwx"}]),
            'device "/dev/nvidia0": invalid permissions "rwx"',
        ),
        (
            dev(f"{CLAIM}-gpu-0", deviceNodes=[{"path": "/dev/nvidia0", "type": "x"}]),
            'invalid type "x"',
        ),
    ],
    ids=[
        "no-edits",
        "name-start",
        "name-char",
        "env",
        "hook-name",
        "mount",
        "permissions",
        "node-type",
    ],
)
def test_bad_device(resolver: Resolver, cdi_dir: Path, device: dict[str, Any], error: str) -> None:
    path = write(cdi_dir, "claim.yaml", spec(device))
    messages = resolver.validate([cdi_dir])
    assert len(messages) == 1 and messages[0].startswith(
        f"{path}: failed to load CDI Spec invalid CDI Spec:"
    )
    assert error in messages[0]


def test_duplicate_device_in_one_spec(resolver: Resolver, cdi_dir: Path) -> None:
    path = write(
        cdi_dir,
        "claim.yaml",
        spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]), dev(f"{CLAIM}-gpu-0", env=["A=2"])),
    )
    assert_rejected(resolver, cdi_dir, path, f'invalid spec, multiple device "{CLAIM}-gpu-0"')


def test_same_device_in_two_spec_files_conflicts(resolver: Resolver, cdi_dir: Path) -> None:
    first = write(
        cdi_dir,
        "a-claim.yaml",
        spec(dev(f"{CLAIM}-gpu-0", env=["A=1"]), dev(f"{CLAIM}-gpu-1", env=["B=1"])),
    )
    second = write(cdi_dir, "b-claim.json", spec(dev(f"{CLAIM}-gpu-0", env=["A=2"])))
    conflict = f'conflicting device "{GPU0}" (specs "{second}", "{first}")'
    assert resolver.validate([cdi_dir]) == [f"{first}: {conflict}", f"{second}: {conflict}"]
    with pytest.raises(CDIError) as exc:
        resolver.resolve([cdi_dir], [GPU0])
    assert str(exc.value).splitlines() == [
        f"CDI device injection failed: unresolvable CDI devices {GPU0}",
        f"CDI spec error: {first}: {conflict}",
        f"CDI spec error: {second}: {conflict}",
    ]
    # Only the conflicting name is dropped; the rest of both specs still resolves.
    assert resolver.resolve([cdi_dir], [GPU1]).env == ("B=1",)


def test_unrelated_invalid_spec_does_not_block_injection(resolver: Resolver, cdi_dir: Path) -> None:
    # containerd logs a failed CDI refresh and injects anyway: only requested devices count.
    write(cdi_dir, "claim.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1"])))
    broken = write(cdi_dir, "other-vendor.yaml", "cdiVersion: 0.5.0\nkind: [not, a, string\n")
    assert [m.split(":")[0] for m in resolver.validate([cdi_dir])] == [str(broken)]
    assert resolver.resolve([cdi_dir], [GPU0]).env == ("A=1",)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("", "failed to unmarshal CDI Spec: EOF"),
        ("null\n", "no Spec data"),
        ("- 1\n", "!!seq into specs.Spec"),
    ],
    ids=["empty", "null", "list"],
)
def test_not_a_spec(resolver: Resolver, cdi_dir: Path, content: str, error: str) -> None:
    path = write(cdi_dir, "claim.yaml", content)
    messages = resolver.validate([cdi_dir])
    assert len(messages) == 1 and messages[0].startswith(f"{path}: ") and error in messages[0]


# -- both resolvers over one directory of everything ----------------------------------------


def test_python_matches_reference(reference_binary: Path, cdi_dir: Path) -> None:
    write(cdi_dir, "00-env.yaml", spec(dev(f"{CLAIM}-gpu-0", env=["A=1", "A=2"]), env=["T=1"]))
    write(
        cdi_dir,
        "01-nodes.json",
        spec(
            dev(
                "n0",
                deviceNodes=[
                    {"path": "/dev/zero"},
                    {"path": "/dev/n", "hostPath": "/dev/null", "uid": 7},
                ],
            ),
            dev(
                "n1",
                deviceNodes=[
                    {"path": "/dev/fifo", "type": "p"},
                    {"path": "/dev/zero", "type": "c"},
                ],
            ),
            dev("n2", deviceNodes=[{"path": "/dev/null", "type": "b"}]),
            dev("n3", deviceNodes=[{"path": "/etc/hostname"}]),
            kind="n.example.com/dev",
        ),
    )
    write(
        cdi_dir,
        "02-mounts-hooks.yaml",
        spec(
            dev(
                "m0",
                mounts=[
                    {"hostPath": "/a", "containerPath": "//x/y/"},
                    {"hostPath": "/b", "containerPath": "rel/dir"},
                    {"hostPath": "/c", "containerPath": "/x", "options": ["rbind"]},
                ],
                hooks=[
                    {"hookName": h, "path": f"/{h}"}
                    for h in reversed(
                        [
                            "prestart",
                            "createRuntime",
                            "createContainer",
                            "startContainer",
                            "poststart",
                            "poststop",
                        ]
                    )
                ],
            ),
            kind="m.example.com/dev",
            mounts=[{"hostPath": "/t", "containerPath": "/x"}],
        ),
    )
    write(
        cdi_dir,
        "03-scalars.yaml",
        "cdiVersion: v0.7.0\nkind: s.example.com/dev\ncontainerEdits: null\ndevices:\n"
        "- {name: 7, annotations: null, containerEdits: {env: [X=0x10, Y=true, Z=~z],"
        " additionalGids: [0, 44], deviceNodes: [{path: /dev/q, type: c, major: 0x1f, minor: 1_0,"
        " fileMode: 0o644, gid: 1.9}]}}\n",
    )
    write(cdi_dir, "04-conflict.yaml", spec(dev("n0", env=["C=1"]), kind="n.example.com/dev"))
    write(
        cdi_dir,
        "05-dupkey.yaml",
        "cdiVersion: 0.3.0\nkind: d.example.com/dev\nkind: x\ndevices: []\n",
    )
    write(
        cdi_dir,
        "06-badtypes.yaml",
        "cdiVersion: 0.3.0\nkind: d.example.com/dev\ndevices: {a: 1}\n"
        "containerEdits: {env: A=1, deviceNodes: [{path: /x, uid: -1}], hooks: [{timeout: x}]}\n",
    )
    write(
        cdi_dir,
        "07-rdt.yaml",
        spec(dev("r0", intelRdt={"closID": "a/b"}), version="0.7.0", kind="r.example.com/d"),
    )
    write(
        cdi_dir,
        "08-net.yaml",
        spec(
            dev("x0", netDevices=[{"hostInterfaceName": "e", "name": "n"}] * 2),
            version="1.1.0",
            kind="x.example.com/d",
        ),
    )

    python, reference = PythonResolver(), ReferenceResolver(reference_binary)
    expected = reference.validate([cdi_dir])
    assert len(expected) == 6
    assert python.validate([cdi_dir]) == expected

    def outcome(r: Resolver, ids: list[str]) -> dict[str, Any] | str:
        try:
            return r.resolve([cdi_dir], ids).to_json()
        except CDIError as exc:
            return str(exc)

    cases = [
        [GPU0],
        ["n.example.com/dev=n1"],
        ["n.example.com/dev=n1", "n.example.com/dev=n0"],
        ["n.example.com/dev=n2"],
        ["n.example.com/dev=n3"],
        ["m.example.com/dev=m0"],
        ["s.example.com/dev=7"],
        [GPU0, "m.example.com/dev=m0", "s.example.com/dev=7", "n.example.com/dev=n1"],
    ]
    for ids in cases:
        assert outcome(python, ids) == outcome(reference, ids), ids
    assert isinstance(outcome(reference, ["s.example.com/dev=7"]), dict)


# -- ContainerEdits and resolver selection ---------------------------------------------------


def test_container_edits_merge_and_json_round_trip() -> None:
    a = ContainerEdits(
        env=("A=1", "B=1"),
        device_nodes=({"path": "/dev/a", "type": "c", "major": 1, "minor": 0},),
        mounts=({"hostPath": "/h", "containerPath": "/a/b", "options": [], "type": ""},),
        hooks=({"hookName": "poststop", "path": "/p", "args": [], "env": [], "timeout": None},),
    )
    b = ContainerEdits(
        env=("C=2", "A=2"),
        device_nodes=({"path": "/dev/a", "type": "c", "major": 2, "minor": 0},),
        mounts=({"hostPath": "/h2", "containerPath": "/a", "options": ["ro"], "type": ""},),
        hooks=({"hookName": "prestart", "path": "/q", "args": [], "env": [], "timeout": 3},),
    )
    m = a.merged(b)
    assert m.env == ("A=2", "B=1", "C=2")
    assert [d["major"] for d in m.device_nodes] == [2]
    assert [x["containerPath"] for x in m.mounts] == ["/a", "/a/b"]
    assert [h["hookName"] for h in m.hooks] == ["prestart", "poststop"]
    assert ContainerEdits.from_json(json.loads(json.dumps(m.to_json()))) == m
    assert merge_env(["PATH=/bin", "A=0"], ["A=1", "B=2", "PATH=/usr/bin"]) == [
        "PATH=/usr/bin",
        "A=1",
        "B=2",
    ]


def test_default_resolver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRADRIVER_CDI_TOOL", raising=False)
    monkeypatch.setenv("DRADRIVER_CACHE", str(tmp_path / "cache"))
    assert isinstance(default_resolver(), PythonResolver)

    # A build without its .complete marker is ignored; a complete one is used.
    build = tmp_path / "cache" / "cdi" / "0123456789abcdef"
    build.mkdir(parents=True)
    tool = build / "cdi-resolve"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert isinstance(default_resolver(), PythonResolver)
    (build / ".complete").touch()
    chosen = default_resolver()
    assert isinstance(chosen, ReferenceResolver) and chosen.binary == tool
    assert isinstance(default_resolver(prefer_reference=False), PythonResolver)

    monkeypatch.setenv("DRADRIVER_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("DRADRIVER_CDI_TOOL", str(build))
    chosen = default_resolver()
    assert isinstance(chosen, ReferenceResolver) and chosen.binary == tool
    monkeypatch.setenv("DRADRIVER_CDI_TOOL", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="DRADRIVER_CDI_TOOL"):
        default_resolver()
