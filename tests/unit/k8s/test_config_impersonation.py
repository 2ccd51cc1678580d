"""Impersonation from the kubeconfig user: the headers client-go sends, one per group
and per extra value."""

from __future__ import annotations

import pytest

from dradriver.k8s import Kube, KubeconfigError, config
from dradriver.k8s.config import escape_key
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig


def test_the_api_server_sees_who_we_impersonate(
    api: FakeAPI, write_kubeconfig: WriteKubeconfig
) -> None:
    user = {
        "token": "admin",
        "as": "jane",
        "as-uid": "1234",
        "as-groups": ["dev", "ops"],
        "as-user-extra": {"scopes.example.com/team": ["a", "b"], "reason": ["audit"]},
    }
    cluster = {"server": api.url, "certificate-authority": str(api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, user)))
    got = kube.get("/who")
    assert got["auth"] == "Bearer admin"
    assert sorted(got["impersonate"]) == [  # each value a header of its own
        ["Impersonate-Extra-reason", "audit"],
        ["Impersonate-Extra-scopes.example.com%2Fteam", "a"],
        ["Impersonate-Extra-scopes.example.com%2Fteam", "b"],
        ["Impersonate-Group", "dev"],
        ["Impersonate-Group", "ops"],
        ["Impersonate-Uid", "1234"],
        ["Impersonate-User", "jane"],
    ]
    # Acting as someone else drops the impersonation with the rest of the identity.
    assert kube.with_token("sa").get("/who")["impersonate"] == []


def test_extra_keys_are_escaped_as_client_go_escapes_them() -> None:
    assert escape_key("example.com/a b%c") == "example.com%2Fa%20b%25c"
    assert escape_key("ünï") == "%C3%BCn%C3%AF"
    assert escape_key("A-Za-z0-9!#$&'*+-.^_`|~") == "A-Za-z0-9!#$&'*+-.^_`|~"


def test_groups_without_a_user_are_refused(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"token": "t", "as-groups": ["dev"]})
    with pytest.raises(KubeconfigError) as exc:
        config.load(str(path))
    assert str(exc.value) == (
        f"kubeconfig {path}, user 'u': as-uid, as-groups or as-user-extra without `as` (a user)"
    )
