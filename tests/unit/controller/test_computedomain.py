"""The ComputeDomain controller's pure core: cliques from slices, placement (best fit,
channels per clique), the template, reading members, and each reconcile step."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from dradriver.api import computedomain as cd
from dradriver.api.config import ComputeDomainChannelConfig, decode
from dradriver.controller.computedomain.controller import node_address
from dradriver.controller.computedomain.placement import (
    NoRoom,
    Placement,
    free_channel,
    node_cliques,
    place,
)
from dradriver.controller.computedomain.reconcile import Plan, orphans, reconcile
from dradriver.controller.computedomain.records import Domain, Fleet, Member, Template, member_of
from dradriver.controller.computedomain.template import template_for
from dradriver.controller.validate import object_problems

DRIVER = "gpu.dradriver.io"
REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "deploy" / "helm" / "dradriver" / "crds" / f"{cd.CRD_NAME}.yaml"
A = "a1b2c3d4-0000-4000-8000-000000000001.1"  # <clusterUuid>.<cliqueId>
B = "a1b2c3d4-0000-4000-8000-000000000001.2"
NOW, LATER = "2026-12-03T12:00:00Z", "2026-12-03T12:05:00Z"


def domain(num_nodes: int = 2, **status: Any) -> Domain:
    return Domain.of(
        {
            "metadata": {
                "namespace": "team",
                "name": "train",
                "uid": str(uuid.UUID(int=7)),
                "generation": 1,
                "finalizers": [cd.FINALIZER],
            },
            "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": "ch"}}},
            "status": status,
        }
    )


def fleet(**kw: Any) -> Fleet:
    kw.setdefault("cliques", {"n1": A, "n2": A, "n3": B, "n4": B, "n5": B})
    return Fleet(**kw)


def ours(d: Domain, clique: str = A, channel: int = 0) -> Template:
    return Template.of(template_for(d, Placement(clique, channel), DRIVER) | {})


def member(node: str | None, ready: bool = False, in_use: bool = True, uid: str = "") -> Member:
    return Member(
        claim=f"pod-{node}-channel",
        domain_uid=uid or str(uuid.UUID(int=7)),
        node=node,
        device="imex-channel" if node else None,
        ready=ready,
        in_use=in_use,
    )


def applied(d: Domain, plan: Plan) -> Domain:
    """The domain as the API server holds it after the plan's status write."""
    assert plan.status is not None
    return Domain.of(
        {
            "metadata": {
                "namespace": d.namespace,
                "name": d.name,
                "uid": d.uid,
                "generation": d.generation,
                "finalizers": list(d.finalizers),
            },
            "spec": {
                "numNodes": d.num_nodes,
                "channel": {"resourceClaimTemplate": {"name": d.template}},
            },
            "status": plan.status,
        }
    )


def ready(plan_or_domain: Plan | Domain) -> dict[str, Any]:
    status = plan_or_domain.status
    assert status is not None
    (cond,) = status["conditions"]
    return dict(cond)


# -- placement --------------------------------------------------------------------------------


def _slice(
    node: str, *cliques: str, driver: str = DRIVER, kind: str = "imex-channel"
) -> dict[str, Any]:
    devs = [
        {
            "name": f"channel-{i}",
            "attributes": {"type": {"string": kind}, "nvlinkDomain": {"string": c}},
        }
        for i, c in enumerate(cliques)
    ]
    return {"spec": {"driver": driver, "nodeName": node, "devices": devs}}


def test_a_nodes_clique_is_its_channels_and_one_that_names_two_is_left_out() -> None:
    slices = [
        _slice("n1", A, A, A, A),
        _slice("n2", A, B),  # the fabric has not settled
        _slice("n3", B),
        _slice("n4", A, driver="other.example.com"),
        # GPUs in a clique, but no channels (off, or a driver without them): no place.
        _slice("n5", A, kind="gpu"),
        # An HGX board's NVLink domain is not a fabric clique.
        _slice("n6", "nvlink-42b5fb7b9bc0"),
        {"spec": {"driver": DRIVER, "nodeName": "n7", "devices": [{"name": "gpu-0"}]}},
    ]
    assert node_cliques(slices, DRIVER) == {"n1": A, "n3": B}


def test_best_fit_keeps_the_large_clique_whole() -> None:
    p = place(domain(2), fleet())
    assert p == Placement(A, 0)
    assert place(domain(3), fleet()) == Placement(B, 0)


def test_nodes_hosting_another_domain_are_not_free() -> None:
    other = str(uuid.UUID(int=9))
    p = place(domain(2), fleet(hosting={"n1": other}))
    assert p == Placement(B, 0)
    # A node hosting this domain itself still counts.
    assert place(domain(2), fleet(hosting={"n1": domain().uid})) == Placement(A, 0)


def test_channels_are_per_clique_and_never_shared() -> None:
    other = str(uuid.UUID(int=9))
    f = fleet(channels={A: {0: other, 1: other}, B: {0: other}})
    assert place(domain(2), f) == Placement(A, 2)
    assert place(domain(3), f) == Placement(B, 1)
    assert free_channel(range(cd.CHANNELS)) is None
    full = fleet(channels={A: dict.fromkeys(range(cd.CHANNELS), other)})
    assert place(domain(2), full) == Placement(B, 0)  # A has the nodes but no channel left


def test_no_room_says_what_each_clique_has() -> None:
    p = place(domain(4), fleet(hosting={"n3": str(uuid.UUID(int=9))}))
    assert isinstance(p, NoRoom) and p.reason == "NoCliqueWithRoom"
    assert f"{A}: 2 of 2 free" in p.message and f"{B}: 2 of 3 free" in p.message
    assert "spec.numNodes is 4" in p.message
    none = place(domain(1), Fleet())
    assert isinstance(none, NoRoom) and none.reason == "NoFabricClique"


# -- the template -----------------------------------------------------------------------------


def test_the_template_pins_clique_and_channel_and_passes_the_webhook() -> None:
    d = domain()
    body = template_for(d, Placement(A, 3), DRIVER)
    assert body["metadata"]["name"] == "ch" and body["metadata"]["namespace"] == "team"
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ComputeDomain", d.uid, True)
    assert body["spec"]["metadata"]["labels"] == {cd.DOMAIN_LABEL: d.uid}
    (req,) = body["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == cd.CHANNEL_CLASS
    (sel,) = req["exactly"]["selectors"]
    assert sel["cel"]["expression"] == f'device.attributes["{DRIVER}"].nvlinkDomain == "{A}"'
    assert object_problems("ResourceClaimTemplate", body, DRIVER) == []
    (cfg,) = body["spec"]["spec"]["devices"]["config"]
    parsed = decode(cfg["opaque"]["parameters"])
    assert isinstance(parsed, ComputeDomainChannelConfig) and parsed.domainUID == d.uid
    assert parsed.channel == 3
    t = Template.of(body | {"metadata": body["metadata"] | {"uid": "t-uid"}})
    assert (t.clique, t.channel, t.belongs_to(d), t.uid) == (A, 3, True, "t-uid")


def test_the_channel_config_is_strict() -> None:
    good = {"apiVersion": "gpu.dradriver.io/v1alpha1", "kind": "ComputeDomainChannelConfig"}
    problems = object_problems(
        "ResourceClaim",
        {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel"}],
                    "config": [
                        {
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": good
                                | {"domain": "x", "domainUID": "not-a-uid", "channel": 0},
                            }
                        }
                    ],
                }
            }
        },
        DRIVER,
    )
    (p,) = problems
    assert "parameters.domainUID" in p.message and "should match pattern" in p.message


# -- members ----------------------------------------------------------------------------------


def claim(
    uid: str, node: str | None = None, *, ready: bool | None = None, reserved: bool = True
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "pod-a-channel",
            "namespace": "team",
            "labels": {cd.DOMAIN_LABEL: "x"},
        },
        "spec": template_for(domain(), Placement(A, 0), DRIVER)["spec"]["spec"],
        "status": {},
    }
    obj["spec"]["devices"]["config"][0]["opaque"]["parameters"]["domainUID"] = uid
    if node:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": "channel", "driver": DRIVER, "pool": node, "device": "imex-channel"}
                ]
            }
        }
    if reserved:
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "a", "uid": "p"}]
    if ready is not None:
        obj["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": node,
                "device": "imex-channel",
                "conditions": [{"type": "Ready", "status": str(ready)}],
            }
        ]
    return obj


def test_a_member_is_read_from_its_claim() -> None:
    uid = domain().uid
    m = member_of(claim(uid, "n1", ready=True), DRIVER)
    assert m == Member("pod-a-channel", uid, "n1", "imex-channel", ready=True, in_use=True)
    m = member_of(claim(uid, "n1", ready=False, reserved=False), DRIVER)
    assert m is not None and not m.ready and not m.in_use
    m = member_of(claim(uid), DRIVER)
    assert m is not None and m.node is None and not m.ready
    # The label is only how the controller lists claims; the config decides the domain.
    m = member_of(claim("other-uid", "n1"), DRIVER)
    assert m is not None and m.domain_uid == "other-uid"
    assert member_of({"metadata": {"name": "x"}, "spec": {}}, DRIVER) is None
    # Before its pod is bound (binding conditions), the node says so as IMEXDaemonReady.
    early = claim(uid, "n1", ready=False)
    early["status"]["devices"][0]["conditions"] = [{"type": "IMEXDaemonReady", "status": "True"}]
    m = member_of(early, DRIVER)
    assert m is not None and m.ready


# -- reconcile --------------------------------------------------------------------------------


def test_a_new_domain_gets_its_finalizer_template_and_placement() -> None:
    d = Domain.of(
        {
            "metadata": {"namespace": "team", "name": "train", "uid": str(uuid.UUID(int=7))},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "ch"}}},
        }
    )
    plan = reconcile(d, None, [], fleet=fleet(), driver=DRIVER, now=NOW)
    assert plan.add_finalizer and not plan.remove_finalizer and not plan.delete_template
    assert plan.create_template is not None
    assert plan.create_template["metadata"]["annotations"] == {
        cd.CLIQUE_ANNOTATION: A,
        cd.CHANNEL_ANNOTATION: "0",
    }
    assert plan.status is not None and (plan.status["clique"], plan.status["channel"]) == (A, 0)
    cond = ready(plan)
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "False",
        "WaitingForPods",
        NOW,
    )
    assert "ResourceClaimTemplate ch" in cond["message"]


def test_readiness_follows_the_members_and_a_pass_with_nothing_new_writes_nothing() -> None:
    d = domain(2)
    t = ours(d)
    f = fleet(addresses={"n1": "10.0.0.1", "n2": "10.0.0.2"})
    one = reconcile(d, t, [member("n1", ready=True), member(None)], fleet=f, driver=DRIVER, now=NOW)
    assert one.create_template is None and not one.add_finalizer
    cond = ready(one)
    assert (cond["status"], cond["reason"]) == ("False", "WaitingForNodes")
    assert cond["message"] == "1 of 2 nodes ready; joined: n1"
    d1 = applied(d, one)
    assert reconcile(
        d1, t, [member("n1", ready=True), member(None)], fleet=f, driver=DRIVER, now=LATER
    ).empty
    two = reconcile(
        d1, t, [member("n1", ready=True), member("n2")], fleet=f, driver=DRIVER, now=LATER
    )
    cond = ready(two)
    assert "IMEX daemon not ready yet on n2" in cond["message"]
    assert cond["lastTransitionTime"] == NOW  # still False: the transition was at NOW
    d2 = applied(d1, two)
    both = reconcile(
        d2,
        t,
        [member("n1", ready=True), member("n2", ready=True)],
        fleet=f,
        driver=DRIVER,
        now=LATER,
    )
    cond = ready(both)
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "True",
        "NodesReady",
        LATER,
    )
    assert both.status is not None and both.status["nodes"] == [
        {
            "name": "n1",
            "ready": True,
            "claim": "pod-n1-channel",
            "clique": A,
            "address": "10.0.0.1",
        },
        {
            "name": "n2",
            "ready": True,
            "claim": "pod-n2-channel",
            "clique": A,
            "address": "10.0.0.2",
        },
    ]


def test_another_domains_claims_are_not_members() -> None:
    d = domain(1)
    plan = reconcile(
        d,
        ours(d),
        [member("n1", ready=True, uid=str(uuid.UUID(int=9)))],
        fleet=fleet(),
        driver=DRIVER,
        now=NOW,
    )
    assert ready(plan)["reason"] == "WaitingForPods"


def test_someone_elses_template_is_left_alone_and_named() -> None:
    d = domain()
    theirs = Template("team", "ch", "u", owner=None, domain_uid=None, clique=None, channel=None)
    plan = reconcile(d, theirs, [], fleet=fleet(), driver=DRIVER, now=NOW)
    assert plan.create_template is None and not plan.delete_template
    cond = ready(plan)
    assert cond["reason"] == "TemplateExists" and "team/ch already exists" in cond["message"]


def test_a_lost_template_is_made_again_where_the_status_placed_it() -> None:
    d = domain(2, clique=B, channel=5)
    plan = reconcile(d, None, [], fleet=fleet(), driver=DRIVER, now=NOW)
    assert plan.create_template is not None
    assert plan.create_template["metadata"]["annotations"][cd.CHANNEL_ANNOTATION] == "5"
    # Unless another domain took the channel meanwhile: placed afresh.
    taken = fleet(channels={B: {5: str(uuid.UUID(int=9))}})
    plan = reconcile(d, None, [], fleet=taken, driver=DRIVER, now=NOW)
    assert plan.status is not None and (plan.status["clique"], plan.status["channel"]) == (A, 0)


def test_no_room_makes_no_template_and_says_why() -> None:
    plan = reconcile(domain(6), None, [], fleet=fleet(), driver=DRIVER, now=NOW)
    assert plan.create_template is None
    assert ready(plan)["reason"] == "NoCliqueWithRoom"
    assert plan.status is not None and "clique" not in plan.status


def test_deletion_waits_for_claims_in_use_then_lets_go() -> None:
    d = Domain.of(
        {
            "metadata": {
                "namespace": "team",
                "name": "train",
                "uid": str(uuid.UUID(int=7)),
                "finalizers": [cd.FINALIZER, "other/keep"],
                "deletionTimestamp": NOW,
            },
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "ch"}}},
        }
    )
    busy = reconcile(
        d,
        ours(d),
        [member("n1"), member("n2", in_use=False)],
        fleet=fleet(),
        driver=DRIVER,
        now=NOW,
    )
    assert busy.delete_template and not busy.remove_finalizer
    cond = ready(busy)
    assert (
        cond["reason"] == "Deleting"
        and "1 claim(s)" in cond["message"]
        and "pod-n1-channel" in cond["message"]
    )
    # Template gone, the last pod ended: the finalizer comes off.
    done = reconcile(d, None, [member("n1", in_use=False)], fleet=fleet(), driver=DRIVER, now=NOW)
    assert done == Plan(remove_finalizer=True)
    gone = Domain.of(
        {"metadata": {"deletionTimestamp": NOW, "finalizers": ["other/keep"]}, "spec": {}}
    )
    assert reconcile(gone, None, [], fleet=fleet(), driver=DRIVER, now=NOW).empty


def test_templates_of_domains_that_are_gone_are_orphans() -> None:
    d = domain()
    mine = ours(d)
    stray = Template("team", "old", "u2", owner="dead", domain_uid="dead", clique=A, channel=1)
    users = Template("team", "theirs", "u3", owner=None, domain_uid=None, clique=None, channel=None)
    assert orphans([mine, stray, users], {d.uid}) == [stray]


# -- the CRD ----------------------------------------------------------------------------------


def test_the_crd_names_what_the_code_uses() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == cd.CRD_NAME
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        cd.GROUP,
        cd.KIND,
        cd.PLURAL,
    )
    (version,) = spec["versions"]
    assert version["name"] == cd.VERSION and version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert set(schema["spec"]["properties"]) == {"numNodes", "channel"}
    assert schema["spec"]["properties"]["numNodes"]["minimum"] == 1
    status = schema["status"]["properties"]
    written = reconcile(
        domain(2),
        ours(domain(2)),
        [member("n1", ready=True)],
        fleet=fleet(addresses={"n1": "10.0.0.1"}),
        driver=DRIVER,
        now=NOW,
    ).status
    assert written is not None and set(written) <= set(status)
    assert set(written["nodes"][0]) <= set(status["nodes"]["items"]["properties"])
    assert set(written["conditions"][0]) <= set(status["conditions"]["items"]["properties"])
    assert status["channel"]["maximum"] >= cd.CHANNELS - 1


def test_a_nodes_imex_address_is_its_label_or_its_internal_ip() -> None:
    node: dict[str, Any] = {
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "10.0.0.1"},
            ]
        },
    }
    assert node_address(node) == "10.0.0.1"
    node["metadata"]["labels"] = {cd.IMEX_ADDRESS_LABEL: "192.168.7.1"}
    assert node_address(node) == "192.168.7.1"
    node["metadata"]["labels"] = {cd.IMEX_ADDRESS_LABEL: "not-an-ip"}
    assert node_address(node) == "10.0.0.1"
    assert node_address({"metadata": {"name": "bare"}}) is None
