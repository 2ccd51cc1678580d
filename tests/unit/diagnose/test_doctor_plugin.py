"""doctor's plugin layer from the plugin's /readyz: the failing check named first, with the
fix for the layer it names."""

from __future__ import annotations

import json

from dradriver.diagnose import doctor_plugin as judge
from dradriver.diagnose.doctor import State
from dradriver.k8s import KubeError
from dradriver.kubeletplugin.endpoints.api_probe import describe


def readyz(**checks: tuple[bool, str]) -> str:
    return json.dumps({k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()})


def test_plugin_layer_from_readyz() -> None:
    url = "http://127.0.0.1:8081/readyz"
    down = judge.registration(url, 0, "Connection refused")
    assert down.state is State.FAIL and "does not answer" in down.line()
    waiting = judge.registration(
        url, 503, readyz(registration=(False, "waiting for the kubelet"), api=(True, "ok"))
    )
    assert "registration: waiting for the kubelet" in waiting.line()
    assert "--kubelet-dir" in waiting.line()
    # Discovery fails first when both do: the lower layer is the cause.
    both = judge.registration(
        url, 503, readyz(registration=(False, "x"), discovery=(False, "NVML layer: gone"))
    )
    assert "/readyz discovery: NVML layer: gone" in both.line()
    assert judge.registration(url, 200, readyz(registration=(True, "registered"))).state is State.OK


HOST = "https://10.0.0.1:6443"


def api_failure(error: KubeError) -> str:
    """/readyz as a plugin whose API probe got `error` answers it."""
    return readyz(
        discovery=(True, "ok"),
        registration=(False, "waiting for the kubelet"),
        api=(False, describe(HOST, error)),
        slices=(False, str(error)),
    )


def test_the_fix_for_a_failed_api_probe_names_what_failed() -> None:
    """401: the credentials, 403: RBAC, no answer: the network and the address. The API
    is named before a registration still under way: it does not fix itself."""
    url = "http://127.0.0.1:8081/readyz"
    cases = {
        KubeError(401, "Unauthorized", "Unauthorized"): "rejects the plugin's credentials",
        KubeError(0, "NoCredentials", "token file gone"): "rejects the plugin's credentials",
        KubeError(403, "Forbidden", "cannot list resourceslices"): "lacks RBAC",
        KubeError(0, "Unreachable", "connection refused"): "cannot reach the API server",
    }
    for error, fix in cases.items():
        layer = judge.registration(url, 503, api_failure(error))
        assert layer.state is State.FAIL and layer.line().startswith("FAIL  plugin: /readyz api:")
        assert fix in layer.fix, layer.line()
    hung = readyz(api=(False, f"the API server at {HOST} is not answering for 4 s"))
    assert "check the network from the node" in judge.registration(url, 503, hung).fix
    # An older plugin's first answer is not a verdict on the API server.
    old = judge.registration(url, 503, readyz(api=(False, "not checked yet")))
    assert old.fix == "the plugin had not probed the API server yet: run doctor again"


def test_a_failing_readyz_check_other_than_the_api_names_its_own_layer() -> None:
    url = "http://127.0.0.1:8081/readyz"

    def fix(**checks: tuple[bool, str]) -> str:
        return judge.registration(url, 503, readyz(**checks)).fix

    nvml = fix(discovery=(False, "NVML layer: libnvidia-ml.so.1 was not found"))
    assert nvml.startswith("the plugin's NVML layer: install the NVIDIA driver on the node")
    rbac = fix(slices=(False, "kubernetes API: 403 Forbidden: cannot create resourceslices"))
    assert rbac.startswith("the plugin may not write its ResourceSlices: check the RBAC")
    starting = fix(checkpoint=(False, "not loaded yet"))
    assert starting == "the plugin is starting: run doctor again in a few seconds"
    other = fix(gpus=(False, "something new"))
    assert other.startswith("the plugin's gpus check fails")


def test_a_stopped_dev_node_plugin_points_at_its_log() -> None:
    layer = judge.registration("http://127.0.0.1:1/readyz", 0, "refused", dev_log="/x/n-plugin.log")
    assert "start the dev node's plugin again" in layer.fix and "/x/n-plugin.log" in layer.fix
    assert "kubectl" not in layer.fix  # a dev node's plugin is no pod
