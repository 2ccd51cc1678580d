"""doctor's plugin layer: the kubelet plugin's /readyz judged check by check, the failing
check that the others depend on named first with the fix for the layer it names (NVML,
the API server, the registration, the checkpoint, the slices). Its own file: the plugin
reports on the layers below it, so its fixes are a table of their own."""

from __future__ import annotations

import json

from dradriver.diagnose.doctor import Layer, State, nvml_fix

# The order /readyz's failing checks are named in: what the others depend on first. The
# API server before the registration: a plugin that cannot reach it is broken whatever
# the kubelet says, while a registration under way only needs a few seconds.
READYZ_ORDER = ("discovery", "api", "checkpoint", "registration", "slices")


def registration(url: str, code: int, body: str, *, dev_log: str = "") -> Layer:
    """From the plugin's /readyz (code 0: no answer). `dev_log`: the log of a dev node's
    plugin (a host process, not a pod)."""
    if code == 0:
        fix = (
            f"start the dev node's plugin again (make demo KEEP=1); why it stopped is in {dev_log}"
            if dev_log
            else "check the plugin pod on this node (kubectl -n <ns> get pods -o wide -l "
            "app.kubernetes.io/component=kubelet-plugin) and its log"
        )
        return Layer(
            "plugin", State.FAIL, f"the kubelet plugin does not answer at {url} ({body}).", fix
        )
    try:
        checks = json.loads(body)
    except ValueError:
        return Layer("plugin", State.FAIL, f"{url} answered {code}: {body[:200]}.")
    failing = {k: v for k, v in checks.items() if not v.get("ok")}
    order = READYZ_ORDER
    for name in sorted(failing, key=lambda n: order.index(n) if n in order else len(order)):
        detail = str(failing[name].get("detail", ""))
        return Layer("plugin", State.FAIL, f"/readyz {name}: {detail}.", readyz_fix(name, detail))
    return Layer("plugin", State.OK, "running and registered with the kubelet (/readyz ok)")


def readyz_fix(check: str, detail: str) -> str:
    """The fix for one failing /readyz check, naming the layer that failed."""
    low = detail.lower()
    if check == "registration":
        if "does not watch" in detail:
            return ""  # the detail already names the directory and the flag
        if "refused" in detail:
            return "the kubelet's reason is above; check the driver name and kubelet version"
        return (
            "wait a few seconds; if it stays, the kubelet does not see the registration "
            "socket: check --kubelet-dir (Helm kubeletDir) against the kubelet's --root-dir"
        )
    if check == "discovery":
        return "the plugin's NVML layer: " + nvml_fix(detail)
    if check == "api":
        return api_fix(detail)
    if check == "checkpoint":
        if "not loaded yet" in low:
            return "the plugin is starting: run doctor again in a few seconds"
        return ""  # the refusal names the checkpoint and what to do
    if check == "slices":
        if "403" in detail or "forbidden" in low:
            return (
                "the plugin may not write its ResourceSlices: check the RBAC of its "
                "ServiceAccount (create, update, delete resourceslices) and the own-node "
                "ResourceSlice admission policy (Helm installs both)"
            )
        if "not published yet" in low:
            return "the plugin is starting: run doctor again in a few seconds"
        return (
            "publishing the node's ResourceSlices fails for the reason above; see the plugin's log"
        )
    return f"the plugin's {check} check fails for the reason above; see the plugin's log"


def api_fix(detail: str) -> str:
    """From the plugin's own API probe (ops/api_probe.py says which answer it got)."""
    low = detail.lower()
    if "not checked yet" in low:
        # A plugin older than this doctor probes on the first /readyz only.
        return "the plugin had not probed the API server yet: run doctor again"
    if "refused the plugin's credentials" in low or "(401" in detail or "no credentials" in low:
        return (
            "the API server rejects the plugin's credentials: check its ServiceAccount token "
            "(the pod's mounted token; recreate the pod after the ServiceAccount was "
            "recreated) or the token or client certificate in its --kubeconfig"
        )
    if "forbids" in low or "(403" in detail:
        return (
            "the plugin's identity lacks RBAC: check the ClusterRole and ClusterRoleBinding "
            "of its ServiceAccount grant list on resourceslices (Helm installs them)"
        )
    if "not answering" in low or "cannot reach" in low or "unreachable" in low:
        return (
            "the plugin cannot reach the API server: check the network from the node to "
            "it and the address the plugin uses (its --kubeconfig's server, or "
            "KUBERNETES_SERVICE_HOST in a pod)"
        )
    return "the API server's answer to the plugin is above; see the plugin's log"
