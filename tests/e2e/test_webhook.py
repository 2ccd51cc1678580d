"""`dradriver controller` as a real process behind the real API server: it patches its CA
into a ValidatingWebhookConfiguration, and claims and templates whose configs for our
driver are wrong are refused with the field named, through the API and through kubectl.

The webhook configuration uses `url: https://127.0.0.1:<port>/validate` (the API server
runs on this machine) and matches only the test's namespace, so other tests never see it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.k8s import Kube, KubeError, path_for

from .helpers import REPO, Cluster, free_port, run_helm, wait_for

CHART = REPO / "deploy" / "helm" / "dradriver"

pytestmark = pytest.mark.e2e
RES = "resource.k8s.io/v1"
ADM = "admissionregistration.k8s.io/v1"
V = "gpu.dradriver.io/v1alpha1"
WEBHOOK = "claims.gpu.dradriver.io"
BAD_PARAMS = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}
BAD_FIELD = "spec.devices.config[0].opaque.parameters.sharing.strategy"
BAD_TEXT = "Input should be 'TimeSlicing' or 'MPS' (got 'Spatial')"


def devices(params: Any, driver: str = "gpu.dradriver.io", refs: list[str] | None = None) -> Any:
    cfg: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if refs is not None:
        cfg["requests"] = refs
    return {
        "requests": [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "h100", "deviceClassName": "gpu.dradriver.io"},
                    {"name": "a100", "deviceClassName": "gpu.dradriver.io"},
                ],
            }
        ],
        "config": [cfg],
    }


def claim(name: str, params: Any, **kw: Any) -> dict[str, Any]:
    return {
        "apiVersion": RES,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices(params, **kw)},
    }


def template(name: str, params: Any) -> dict[str, Any]:
    return {
        "apiVersion": RES,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices(params)}},
    }


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    log_path: Path
    healthz_port: int
    config_name: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readyz(self) -> tuple[int, dict[str, Any]]:
        assert self.proc.poll() is None, f"controller exited:\n{self.log()[-3000:]}"
        url = f"http://127.0.0.1:{self.healthz_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, {}


def webhook_config(
    name: str, port: int, namespace: str, match_conditions: list[Any] | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": ADM,
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": WEBHOOK,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate", "caBundle": ""},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": [namespace],
                        }
                    ]
                },
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }
    if match_conditions is not None:
        config["webhooks"][0]["matchConditions"] = match_conditions
    return config


def create_dry_run(kube: Kube, ns: str, obj: dict[str, Any]) -> None:
    kube.request("POST", path_for(RES, "resourceclaims", ns), body=obj, query={"dryRun": "All"})


def refused_by_webhook(kube: Kube, ns: str) -> str:
    """'' while the API server does not call our webhook with our CA yet (it picks up
    configuration changes within a moment), else the refusal."""
    try:
        create_dry_run(kube, ns, claim("probe", BAD_PARAMS))
    except KubeError as exc:
        return exc.message if "denied the request" in exc.message else ""
    raise AssertionError("a bad claim was admitted: is the webhook configuration in effect?")


@pytest.fixture
def controller(
    cluster: Cluster, kube: Kube, namespace: str, short_tmp: Path
) -> Iterator[Controller]:
    with running_controller(cluster, kube, namespace, short_tmp) as ctl:
        yield ctl


@contextlib.contextmanager
def running_controller(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    short_tmp: Path,
    *,
    driver: str | None = None,
    match_conditions: list[Any] | None = None,
) -> Iterator[Controller]:
    """`dradriver controller` and its webhook configuration for `namespace` only, ready
    (its CA patched in); both gone afterwards. Also used by the fault catalogue."""
    port, healthz_port = free_port(), free_port()
    name = f"dradriver-e2e-{secrets.token_hex(3)}"
    log_path = short_tmp / "controller.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dradriver.cli",
                "controller",
                "--kubeconfig",
                cluster.kubeconfig,
                "--webhook-address",
                "127.0.0.1",
                "--webhook-port",
                str(port),
                "--healthz-port",
                str(healthz_port),
                "--webhook-config-name",
                name,
                "--namespace",
                namespace,
                "--log-level",
                "debug",
                *(["--driver-name", driver] if driver else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    ctl = Controller(proc, log_path, healthz_port, name)
    path = path_for(ADM, "validatingwebhookconfigurations", name=name)
    try:
        # Started first, it waits for the configuration and patches it once created.
        def waiting() -> bool:
            code, doc = ctl.readyz()
            return code == 503 and "not found" in doc["caBundle"]["detail"]

        wait_for(waiting, "the controller unready, waiting for its configuration", 30)
        kube.create(
            path_for(ADM, "validatingwebhookconfigurations"),
            webhook_config(name, port, namespace, match_conditions),
        )
        wait_for(lambda: ctl.readyz()[0] == 200, "the controller ready (caBundle patched)", 30)
        yield ctl
    finally:
        with contextlib.suppress(KubeError):
            kube.delete(path, missing_ok=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_ca_bundle_patched_and_clean_stop(kube: Kube, controller: Controller) -> None:
    cfg = kube.get(path_for(ADM, "validatingwebhookconfigurations", name=controller.config_name))
    wh = cfg["webhooks"][0]
    bundle = base64.b64decode(wh["clientConfig"]["caBundle"])
    assert bundle.startswith(b"-----BEGIN CERTIFICATE-----")
    assert wh["failurePolicy"] == "Fail"
    assert "webhook configuration patched" in controller.log()
    controller.proc.send_signal(signal.SIGTERM)
    assert controller.proc.wait(timeout=15) == 0
    assert "stopped" in controller.log()


def test_bad_configs_refused_naming_the_field_good_ones_admitted(
    kube: Kube, namespace: str, controller: Controller
) -> None:
    msg = wait_for(lambda: refused_by_webhook(kube, namespace), "the webhook in effect", 30)
    claims = path_for(RES, "resourceclaims", namespace)

    with pytest.raises(KubeError) as err:
        kube.create(claims, claim("bad", BAD_PARAMS))
    assert err.value.status == 422 and err.value.reason == "Invalid"
    assert err.value.message == (
        f'admission webhook "{WEBHOOK}" denied the request: ResourceClaim "bad": '
        f"{BAD_FIELD}: {BAD_TEXT}"
    )
    assert msg == err.value.message.replace('"bad"', '"probe"')

    good = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    kube.create(claims, claim("good", good, refs=["gpu/h100"]))
    # Updates of an admitted claim go through the webhook too, and are admitted. (A PUT of
    # what was read: a patch makes the API server re-encode the opaque parameters, and it
    # then calls the byte-for-byte different, immutable spec changed.)
    good_claim = kube.get(f"{claims}/good")
    good_claim["metadata"]["labels"] = {"team": "a"}
    kube.replace(f"{claims}/good", good_claim)

    with pytest.raises(KubeError) as err:
        kube.create(
            path_for(RES, "resourceclaimtemplates", namespace),
            template("bad-template", {"apiVersion": V, "kind": "GpuConfig", "sharng": {}}),
        )
    assert err.value.message.endswith(
        'ResourceClaimTemplate "bad-template": '
        "spec.spec.devices.config[0].opaque.parameters.sharng: unknown field; did you mean "
        "sharing? (allowed here: apiVersion, kind, sharing)"
    )

    # NVIDIA's config API (manifests written for its driver): its GpuConfig is admitted,
    # a kind dradriver does not do is refused by name, at apply time.
    nvidia = "resource.nvidia.com/v1beta1"
    mps = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
    nv_good = {"apiVersion": nvidia, "kind": "GpuConfig", "sharing": mps}
    kube.create(claims, claim("nvidia", nv_good, refs=["gpu/h100"]))
    with pytest.raises(KubeError) as err:
        kube.create(claims, claim("vfio", {"apiVersion": nvidia, "kind": "VfioDeviceConfig"}))
    assert err.value.status == 422 and (
        "kind: VfioDeviceConfig of resource.nvidia.com/v1beta1 (NVIDIA's DRA driver) is not "
        "supported: GPU passthrough" in err.value.message
    )

    # Another driver's parameters are its own business.
    kube.create(claims, claim("other-driver", {"anything": "goes"}, driver="other.example.com"))

    log = controller.log()
    assert f"claim={namespace}/bad" in log and f"field={BAD_FIELD.rsplit('.', 2)[0]}" in log


def test_kubectl_apply_shows_the_field(
    cluster: Cluster, kube: Kube, namespace: str, controller: Controller, short_tmp: Path
) -> None:
    if cluster.bin_dir is None:
        pytest.skip("external cluster: no locally built kubectl")
    wait_for(lambda: refused_by_webhook(kube, namespace), "the webhook in effect", 30)
    manifest = short_tmp / "bad-claim.yaml"
    manifest.write_text(yaml.safe_dump(claim("bad-claim", BAD_PARAMS)))
    out = subprocess.run(
        [
            str(cluster.bin_dir / "kubectl"),
            "--kubeconfig",
            cluster.kubeconfig,
            "-n",
            namespace,
            "apply",
            "-f",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1, out
    assert out.stderr.strip() == (
        f'The request is invalid: error when creating "{manifest}": admission webhook '
        f'"{WEBHOOK}" denied the request: ResourceClaim "bad-claim": {BAD_FIELD}: {BAD_TEXT}'
    )


def test_a_share_with_its_own_sharing_config_is_refused_on_the_alpha_cluster(
    alpha_cluster: Cluster, alpha_kube: Kube, short_tmp: Path
) -> None:
    """Q9: where DRAConsumableCapacity is on, the API server keeps a request's capacity
    (elsewhere it drops the field before admission, and there is no share to refuse), and
    the webhook refuses a TimeSlicing or MPS config for that share: a share runs beside the
    device's other shares under its one MPS daemon. Without the config it is admitted."""
    ns = f"alpha-webhook-{secrets.token_hex(3)}"
    alpha_kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    share = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.dradriver.io",
            "capacity": {"requests": {"memory": "20Gi"}},
        },
    }

    def share_claim(name: str, strategy: str | None) -> dict[str, Any]:
        devices: dict[str, Any] = {"requests": [share]}
        if strategy is not None:
            params = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": strategy}}
            devices["config"] = [
                {
                    "requests": ["gpu"],
                    "opaque": {"driver": "gpu.dradriver.io", "parameters": params},
                }
            ]
        return {"metadata": {"name": name}, "spec": {"devices": devices}}

    claims = path_for(RES, "resourceclaims", ns)
    try:
        with running_controller(alpha_cluster, alpha_kube, ns, short_tmp):
            wait_for(lambda: refused_by_webhook(alpha_kube, ns), "the webhook in effect", 30)
            for strategy in ("MPS", "TimeSlicing"):
                with pytest.raises(KubeError) as err:
                    alpha_kube.create(claims, share_claim("own-daemon", strategy))
                assert err.value.status == 422
                assert err.value.message.startswith(
                    f'admission webhook "{WEBHOOK}" denied the request: ResourceClaim '
                    '"own-daemon": spec.devices.config[0].opaque.parameters.sharing: a '
                    f"{strategy} config cannot apply to request 'gpu', which asks for part of "
                    "a device's capacity (spec.devices.requests[0].exactly.capacity)"
                ), err.value.message
                assert err.value.message.endswith(
                    "Drop the sharing config for this request, or ask for a whole device "
                    "(no capacity requests)"
                )
            admitted = alpha_kube.create(claims, share_claim("plain-share", None))
            assert admitted["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
                "requests": {"memory": "20Gi"}
            }
    finally:
        with contextlib.suppress(KubeError):
            alpha_kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def test_as_nvidias_driver_a_class_it_does_not_serve_is_refused_at_apply(
    cluster: Cluster, kube: Kube, namespace: str, short_tmp: Path, helm: Path
) -> None:
    """nvidiaCompatible: the webhook, with the chart's match conditions (which the API
    server compiles here), also sees claims naming NVIDIA's classes dradriver does not
    serve, and refuses them by name; a plain GPU claim of NVIDIA's class goes through."""
    rendered = run_helm(helm, "template", "x", str(CHART), values={"nvidiaCompatible": True})
    (hook,) = next(
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ValidatingWebhookConfiguration"
    )["webhooks"]
    with running_controller(
        cluster, kube, namespace, short_tmp, driver="gpu.nvidia.com",
        match_conditions=hook["matchConditions"],
    ):  # fmt: skip
        claims = path_for(RES, "resourceclaims", namespace)

        def vfio() -> dict[str, Any]:
            request = {"name": "vm", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com"}}
            return {"metadata": {"name": "vm"}, "spec": {"devices": {"requests": [request]}}}

        def refused() -> KubeError | None:
            try:
                kube.request("POST", claims, body=vfio(), query={"dryRun": "All"})
            except KubeError as exc:
                return exc
            return None

        err = wait_for(refused, "the webhook to refuse the VFIO claim", 30, interval=0.3)
        assert (
            err.status == 422
            and (
                "spec.devices.requests[0].exactly.deviceClassName: vfio.gpu.nvidia.com is a class "
                "of NVIDIA's DRA driver that dradriver does not serve: GPU passthrough"
            )
            in err.message
        )
        gpu = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
        kube.create(claims, {"metadata": {"name": "gpu"}, "spec": {"devices": {"requests": [gpu]}}})
