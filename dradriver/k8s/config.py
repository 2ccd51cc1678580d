"""Where the API server is and who we are to it, read by the official library's own
loaders into its Configuration: a kubeconfig (several files joined by os.pathsep, merged
by its KubeConfigMerger), or the pod's service account (its InClusterConfigLoader).

What the loaders lack is added here, thinly:
- the current-context of merged files is the first file's that names one, as kubectl
  has it (the merger keeps the last);
- the user's impersonation fields become headers (impersonation.py);
- an exec plugin is taken out of the loader's hands (exec_auth.py says why);
- a token file is read again when it changes (auth.py): the kubeconfig loader reads a
  tokenFile once, the in-cluster one re-reads the token every minute whether it changed
  or not, so that re-read is turned off and ours does it;
- a kubeconfig's proxy-url is used for every request, as client-go does; NO_PROXY from the
  environment applies to the environment's proxy only;
- every failure of a loader is one KubeconfigError naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dradriver.k8s import impersonation
from dradriver.k8s.errors import KubeconfigError, one_line
from dradriver.k8s.exec_auth import ExecAuth

DEFAULT_KUBECONFIG = "~/.kube/config"


@dataclass(frozen=True)
class Loaded:
    """A Configuration and what we add to it."""

    configuration: Any  # kubernetes.client.Configuration
    token_file: str | None = None
    exec: ExecAuth | None = None
    impersonate: impersonation.Headers = ()


def load(path: str | None) -> Loaded:
    """`path` (a kubeconfig, or several joined by os.pathsep); with None, the pod's service
    account when running in a pod, else $KUBECONFIG or ~/.kube/config."""
    if path:
        return load_kubeconfig(path)
    incluster, why_not = load_incluster()
    if incluster is not None:
        return incluster
    default = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    try:
        return load_kubeconfig(default)
    except KubeconfigError as exc:
        if _existing(default):
            raise
        raise KubeconfigError(f"not running in a pod ({why_not}) and {exc}") from exc


def load_incluster(environ: dict[str, str] | None = None) -> tuple[Loaded | None, str]:
    """The service account's config, or None and why not (no service env, no token or CA
    file: not in a pod), for the caller to try a kubeconfig."""
    from kubernetes import client
    from kubernetes.config import incluster_config

    token = incluster_config.SERVICE_TOKEN_FILENAME
    cfg = client.Configuration()
    loader = incluster_config.InClusterConfigLoader(
        token_filename=token,
        cert_filename=incluster_config.SERVICE_CERT_FILENAME,
        try_refresh_token=False,
        environ=os.environ if environ is None else environ,
    )
    try:
        loader.load_and_set(cfg)
    except Exception as exc:  # ConfigException, or a file that vanished meanwhile
        return None, one_line(exc).rstrip(".")
    return Loaded(cfg, token_file=token), ""


def load_kubeconfig(paths: str) -> Loaded:
    """The current context of the kubeconfig files in `paths`."""
    from kubernetes.config import kube_config

    try:
        merger = kube_config.KubeConfigMerger(paths)
    except Exception as exc:  # yaml's errors, an empty file, not a mapping
        problem = _problem(exc, "not a kubeconfig")
        raise KubeconfigError(f"kubeconfig {_failed_file(exc, paths)}: {problem}") from exc
    if merger.config is None:
        raise KubeconfigError(f"no kubeconfig at {paths}: no such file")
    try:
        return _load(merger, paths)
    except KubeconfigError:
        raise
    except Exception as exc:  # ConfigException, a file it names, a malformed entry
        raise KubeconfigError(f"kubeconfig {paths}: {_problem(exc, 'a malformed entry')}") from exc


def _load(merger: Any, paths: str) -> Loaded:
    from kubernetes import client
    from kubernetes.config import kube_config

    merged = merger.config
    current = _current_context(merger)
    if current is None:
        raise KubeconfigError(f"kubeconfig {paths}: no current-context set")
    context = merged["contexts"].get_with_name(current)["context"]
    cluster = merged["clusters"].get_with_name(context["cluster"])["cluster"]
    # The loader's checks stop short of these: without a server it keeps the
    # Configuration's default (http://localhost), and it takes any scheme.
    server = str(cluster.safe_get("server") or "")
    if not server:
        raise KubeconfigError(
            f"kubeconfig {paths}: the cluster {context['cluster']!r} has no server"
        )
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig {paths}: server {server!r} is not an http(s) URL")
    user_name = context.safe_get("user")
    user = None
    if user_name and merged.safe_get("users"):
        entry = merged["users"].get_with_name(user_name, safe=True)
        user = entry["user"] if entry is not None else None
    where = f"kubeconfig {paths}, user {user_name!r}"
    token_file: str | None = None
    exec_auth: ExecAuth | None = None
    headers: impersonation.Headers = ()
    if user is not None:
        body: dict[str, Any] = user.value
        user_dir = os.path.dirname(os.path.abspath(user.path))
        # The loader would run the plugin now, once, and log its failure instead of
        # raising it. A token or an auth-provider wins over exec (the loader's order), so
        # exec is only ours when it would have been used; the loader never sees it.
        if body.get("exec") and not any(
            body.get(k) for k in ("auth-provider", "token", "tokenFile")
        ):
            exec_auth = ExecAuth(
                user["exec"],
                cwd=user_dir,
                cluster=cluster.value,
                cluster_dir=os.path.dirname(os.path.abspath(cluster.path)),
                where=where,
            )
        body.pop("exec", None)
        if body.get("tokenFile") and not body.get("token"):
            token_file = os.path.normpath(os.path.join(user_dir, str(body["tokenFile"])))
        headers = impersonation.headers(body, where)

    cfg = client.Configuration()
    loader = kube_config.KubeConfigLoader(
        config_dict=merged, active_context=current, config_base_path=None
    )
    loader.load_and_set(cfg)
    if cluster.safe_get("proxy-url"):
        cfg.no_proxy = None
    return Loaded(cfg, token_file=token_file, exec=exec_auth, impersonate=headers)


def _current_context(merger: Any) -> str | None:
    """The first file's current-context, as kubectl reads merged files."""
    for doc in merger.config_files.values():
        if isinstance(doc, dict) and doc.get("current-context"):
            return str(doc["current-context"])
    return None


def with_token(cfg: Any, token: str) -> Any:
    """A Configuration for the same server and trust, authenticated by `token` alone: no
    client certificate, no refresh hook, nothing that could bring the first identity back."""
    from kubernetes import client

    out = client.Configuration(
        host=cfg.host,
        api_key={"BearerToken": f"Bearer {token}"},
        ssl_ca_cert=cfg.ssl_ca_cert,
        ca_cert_data=cfg.ca_cert_data,
        verify_ssl=cfg.verify_ssl,
        assert_hostname=cfg.assert_hostname,
        tls_server_name=cfg.tls_server_name,
        proxy=cfg.proxy,
        proxy_headers=cfg.proxy_headers,
    )
    out.no_proxy = cfg.no_proxy
    return out


def _existing(paths: str) -> list[str]:
    return [p for p in paths.split(os.pathsep) if p and os.path.isfile(os.path.expanduser(p))]


def _failed_file(exc: BaseException, paths: str) -> str:
    """The file yaml failed in, when it says (the merger reads several)."""
    mark = getattr(exc, "problem_mark", None)
    name = getattr(mark, "name", None)
    return str(name) if name and os.path.isfile(str(name)) else paths


def _problem(exc: BaseException, otherwise: str) -> str:
    import yaml

    if isinstance(exc, yaml.YAMLError):
        return f"not valid YAML: {one_line(exc)}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or one_line(exc)}: {exc.filename}"
    if type(exc).__name__ == "ConfigException":
        return one_line(exc)
    return f"{otherwise} ({type(exc).__name__}: {one_line(exc)})"
