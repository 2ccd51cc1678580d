"""Which nodes `dradriver doctor` checks, and with what: a dev cluster's registry (its
plugins are host processes the API server cannot point at) or the flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dradriver.commands import dev_nodes
from dradriver.commands import doctor as command
from dradriver.commands.dev_nodes import DevNode, RegistryError


def entry(name: str, root: Path) -> DevNode:
    return DevNode(
        node=name,
        readyz=f"http://127.0.0.1:9{len(name)}/readyz",
        devices="fake:1xL4",
        mig_mode="none",
        cdi_dir=str(root / name / "cdi"),
        state_dir=str(root / f"{name}-state"),
        kubelet_dir=str(root / name),
        plugin_log=str(root / f"{name}-plugin.log"),
    )


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def dev_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("KUBECONFIG", "NODE_NAME", "DRADRIVER_NODE_NAME", "DRADRIVER_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "kubeconfig").write_text("")
    for name in ("node-b", "node-a"):
        dev_nodes.write(tmp_path, entry(name, tmp_path))
    return tmp_path


def test_the_registry_round_trips(dev_cluster: Path) -> None:
    assert dev_nodes.load(dev_cluster) == [
        entry("node-a", dev_cluster),
        entry("node-b", dev_cluster),
    ]
    assert dev_nodes.cluster_dir(str(dev_cluster / "kubeconfig")) == dev_cluster.resolve()
    (dev_cluster / "nodes" / "bad.json").write_text("{")
    with pytest.raises(RegistryError, match=r"bad\.json"):
        dev_nodes.load(dev_cluster)


def test_the_dev_cluster_is_found_from_the_kubeconfig(
    dev_cluster: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(dev_cluster / "kubeconfig"))
    assert dev_nodes.cluster_dir(None) == dev_cluster.resolve()
    monkeypatch.setenv("KUBECONFIG", f"{dev_cluster / 'kubeconfig'}:/etc/other")
    assert dev_nodes.cluster_dir(None) is None  # a merged list is no dev cluster's
    plain = tmp_path_factory.mktemp("plain")
    assert dev_nodes.cluster_dir(str(plain / "kubeconfig")) is None


def test_no_flags_in_a_dev_cluster_checks_every_registered_node(
    dev_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(dev_cluster / "kubeconfig"))
    nodes, where = command.targets(parse())
    assert where == dev_cluster.resolve()
    assert [n.node for n in nodes] == ["node-a", "node-b"]
    a = entry("node-a", dev_cluster)
    assert (nodes[0].readyz, nodes[0].devices, nodes[0].cdi_dir, nodes[0].state_dir) == (
        a.readyz,
        a.devices,
        a.cdi_dir,
        a.state_dir,
    )
    assert nodes[0].mig_mode == "none" and nodes[0].dev_log == a.plugin_log
    assert nodes[0].containerd_config is None  # a hollow node runs no containerd


def test_flags_win_over_the_registry_and_node_picks_one(
    dev_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = str(dev_cluster / "kubeconfig")
    (n,), where = command.targets(parse("--kubeconfig", kubeconfig, "--node", "node-b"))
    assert where is not None and n.node == "node-b" and n.readyz.endswith(":96/readyz")
    (n,), _ = command.targets(
        parse("--kubeconfig", kubeconfig, "--node", "node-b", "--cdi-dir", "/elsewhere")
    )
    assert n.cdi_dir == "/elsewhere" and n.devices == "fake:1xL4"


def test_outside_a_dev_cluster_the_node_is_this_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("KUBECONFIG", "DRADRIVER_NODE_NAME", "DRADRIVER_CDI_DIR", "DRADRIVER_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    (n,), where = command.targets(parse("--kubeconfig", str(tmp_path / "kubeconfig")))
    assert where is None and n.node == "gpu-node-1" and n.readyz is None
    assert (n.cdi_dir, n.state_dir) == ("/var/run/cdi", "/var/lib/dradriver")
    assert n.containerd_config == "/etc/containerd/config.toml" and n.dev_log == ""
    # A node the registry does not hold is checked as one whose plugin runs in a pod.
    dev_nodes.write(tmp_path, entry("node-a", tmp_path))
    (n,), where = command.targets(
        parse("--kubeconfig", str(tmp_path / "kubeconfig"), "--node", "gpu-node-2")
    )
    assert where is None and n.node == "gpu-node-2" and n.readyz is None
