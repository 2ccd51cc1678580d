"""The ResourceClaimTemplate a ComputeDomain's job names (pure): the IMEX channel device
of a node of the domain's clique, with the opaque config that tells the node which domain
the claim is for and its channel number.

Each pod of the job gets its own claim from it; since a node's channel device can be
allocated once, two pods of the job never share a node, which is what numNodes means.
"""

from __future__ import annotations

import json
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.api.config import API_VERSION as CONFIG_API_VERSION
from dradriver.controller.computedomain.placement import Placement
from dradriver.controller.computedomain.records import Domain

RES = "resource.k8s.io/v1"


def selector(driver: str, placement: Placement) -> str:
    attrs = f"device.attributes[{json.dumps(driver)}]"
    return f"{attrs}.nvlinkDomain == {json.dumps(placement.clique)}"


def template_for(
    domain: Domain, placement: Placement, driver: str, *, device_class: str = cd.CHANNEL_CLASS
) -> dict[str, Any]:
    labels = {cd.DOMAIN_LABEL: domain.uid}
    return {
        "apiVersion": RES,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": domain.template,
            "namespace": domain.namespace,
            "labels": labels,
            "annotations": {
                cd.CLIQUE_ANNOTATION: placement.clique,
                cd.CHANNEL_ANNOTATION: str(placement.channel),
            },
            "ownerReferences": [
                {
                    "apiVersion": cd.API_VERSION,
                    "kind": cd.KIND,
                    "name": domain.name,
                    "uid": domain.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            # Copied onto every claim made from the template: the controller lists a
            # domain's claims by this label.
            "metadata": {"labels": labels},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": cd.CHANNEL_REQUEST,
                            "exactly": {
                                "deviceClassName": device_class,
                                "selectors": [{"cel": {"expression": selector(driver, placement)}}],
                            },
                        }
                    ],
                    "config": [
                        {
                            "requests": [cd.CHANNEL_REQUEST],
                            "opaque": {
                                "driver": driver,
                                "parameters": {
                                    "apiVersion": CONFIG_API_VERSION,
                                    "kind": "ComputeDomainChannelConfig",
                                    "domain": domain.name,
                                    "domainUID": domain.uid,
                                    "channel": placement.channel,
                                },
                            },
                        }
                    ],
                }
            },
        },
    }
