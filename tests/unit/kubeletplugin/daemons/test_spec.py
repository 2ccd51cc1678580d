"""A daemon's pod, as kubeletplugin/daemons/spec.py writes it: bound to the node, out of
every taint's way, without API access, owned by the Node; the driver's daemon chrooted
into the host's driver root with its directories inside it, a stand-in at its own paths."""

from __future__ import annotations

from pathlib import Path

from dradriver.kubeletplugin.daemons.spec import (
    CLAIM,
    DaemonSpec,
    PodSite,
    imex_name,
    mps_name,
    pod_manifest,
    shares_name,
)
from dradriver.nvml.host import DaemonCommand, RealHost

SITE = PodSite("node-a", "dradriver", "dradriver:0.1.0", "/run/nvidia/driver", "node-uid")
UID = "3f1c2b9a-4d5e-4f60-8a7b-1c2d3e4f5a6b"


def test_the_drivers_mps_daemon_runs_in_the_driver_root() -> None:
    pipe, logs, shm = (
        Path("/var/lib/dradriver/mps/c-0/pipe"),
        Path("/var/lib/dradriver/mps/c-0/log"),
        "/var/lib/dradriver/mps/c-0/shm",
    )
    spec = DaemonSpec(
        name=mps_name(UID, 0),
        role="mps",
        serves=((CLAIM, UID),),
        command=RealHost().mps_daemon(["GPU-a"], pipe, logs, shm_dir=Path(shm)),
        dirs=(str(pipe), str(logs)),
        shm=shm,
    )
    pod = pod_manifest(spec, SITE)
    meta, body = pod["metadata"], pod["spec"]
    assert meta["name"] == f"mps-{UID}-0" and meta["namespace"] == "dradriver"
    assert meta["labels"][CLAIM] == UID
    assert meta["labels"]["app.kubernetes.io/component"] == "mps-daemon"
    # Bound to its node, never scheduled; every taint tolerated (it serves running pods).
    assert body["nodeName"] == "node-a" and body["tolerations"] == [{"operator": "Exists"}]
    assert body["restartPolicy"] == "Always" and body["automountServiceAccountToken"] is False
    assert "hostNetwork" not in body
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Node", "node-a", "node-uid", True,
    )  # fmt: skip
    (c,) = body["containers"]
    assert c["command"] == ["chroot", "/driver-root", "nvidia-cuda-mps-control", "-f"]
    assert c["lifecycle"]["preStop"]["exec"]["command"][:2] == ["chroot", "/driver-root"]
    assert c["securityContext"] == {"privileged": True}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in body["volumes"]}
    assert paths["driver-root"] == "/run/nvidia/driver" and mounts["driver-root"] == "/driver-root"
    # The pipe and log directories at their host paths inside the chroot, and the claim's
    # tmpfs as its /dev/shm there: what the clients see at the same host paths.
    assert {mounts[n]: paths[n] for n in ("dir-0", "dir-1", "shm")} == {
        f"/driver-root{pipe}": str(pipe),
        f"/driver-root{logs}": str(logs),
        "/driver-root/dev/shm": shm,
    }
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe) and env["CUDA_VISIBLE_DEVICES"] == "GPU-a"


def test_a_stand_in_runs_unprivileged_at_its_own_paths() -> None:
    spec = DaemonSpec(
        name=imex_name("d-uid", "node-a"),
        role="imex",
        serves=((CLAIM, UID),),
        command=DaemonCommand(("/usr/bin/python3", "-m", "fakenvml.imexd", "-c", "/s/config.cfg")),
        dirs=("/s",),
        host_network=True,
    )
    body = pod_manifest(spec, PodSite("node-a", "ns", "img"))["spec"]
    (c,) = body["containers"]
    assert c["command"][0] == "/usr/bin/python3" and "lifecycle" not in c
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert [
        (m["mountPath"], v["hostPath"]["path"])
        for m, v in zip(c["volumeMounts"], body["volumes"], strict=True)
    ] == [("/s", "/s")]
    assert body["hostNetwork"] is True
    assert "ownerReferences" not in pod_manifest(spec, PodSite("node-a", "ns", "img"))["metadata"]


def test_names_are_stable_for_what_a_daemon_serves() -> None:
    assert shares_name("GPU-9B3C2810-aaaa") == "mps-gpu-9b3c2810-aaaa"
    assert imex_name("d", "node-a") == imex_name("d", "node-a") != imex_name("d", "node-b")
    long_node = "n" * 253
    assert len(imex_name(UID, long_node)) <= 63
