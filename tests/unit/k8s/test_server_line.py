"""The plugin lays its slices out for the line its API server runs, and follows the
control plane when it is upgraded under the running plugin (dradriver.k8s.server_line)."""

from __future__ import annotations

from pathlib import Path

from dradriver.k8s import Kube
from dradriver.k8s.lines import NEWEST
from dradriver.k8s.server_line import ServerLine
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import configuration


def test_the_line_is_read_once_then_again_after_ttl_or_a_refusal(api: FakeAPI, kube: Kube) -> None:
    now = [0.0]
    server = ServerLine(kube, ttl=60, clock=lambda: now[0])
    server.prefetch()
    assert server.line().minor == 34 and server.version == "v1.34.4"
    api.git_version = "v1.37.2"  # the control plane upgraded under the plugin
    now[0] = 30
    assert server.line().minor == 34  # not asked again within ttl
    now[0] = 61
    assert server.line().minor == 37
    api.git_version = "v1.36.3-gke.1200"
    server.forget()  # the API server refused a slice: ask now
    assert server.line().minor == 36
    assert [p for p in api.paths() if p.startswith("/version")] == ["/version"] * 3


def test_an_api_server_that_does_not_answer_gets_the_newest_layout(tmp_path: Path) -> None:
    gone = Kube(configuration("https://127.0.0.1:9", "t", ssl_ca_cert=None))
    try:
        server = ServerLine(gone)
        assert server.line() is NEWEST
    finally:
        gone.close()


def test_a_server_that_did_not_answer_is_asked_again_at_once(api: FakeAPI, kube: Kube) -> None:
    """An upgrade restarts the API server: the ask that fails then is not the answer for
    the next minute; the first one the new server answers is."""
    now = [0.0]
    server = ServerLine(kube, ttl=60, clock=lambda: now[0])
    assert server.line().minor == 34
    api.deny.add("Bearer secret")  # refused, as a server mid-restart would
    server.forget()
    assert server.line().minor == 34  # the last known line meanwhile
    api.deny.clear()
    api.git_version = "v1.37.2"
    now[0] = 1  # well within ttl
    assert server.line().minor == 37
