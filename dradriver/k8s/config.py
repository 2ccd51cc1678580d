"""Where the API server is and who we are to it, read by the official library's own
loaders into its Configuration: a kubeconfig (several files joined by os.pathsep, merged
by its KubeConfigMerger), or the pod's service account (its InClusterConfigLoader, which
reads the rotated token again each minute). The library runs an exec plugin at load, and
again from the Configuration's refresh hook when the plugin's token expires.

What the library lacks, added here:
- merged files' current-context is the first file's that names one, as kubectl has it;
- the user's impersonation fields (`as`, `as-uid`, `as-groups`, `as-user-extra`) become
  the headers client-go sends for them: one per group and per extra value (the API server
  reads repeated headers, never a comma-joined one), extra keys escaped as client-go does;
- a missing or failing exec plugin is an error naming it (with its installHint when it
  is missing): the library only logs it and goes on without credentials;
- a kubeconfig's tokenFile is read again at each refresh, as client-go does (the library
  reads it once): a projected token is rotated in place;
- a kubeconfig's proxy-url is used for every request, as client-go does;
- every failure of a loader is one KubeconfigError naming the file.
Not added, as no daemon of ours runs on an exec plugin (a command re-run gets a fresh
credential): renewal after a 401, renewing an exec plugin's client certificate, and
client-go's interactiveMode and provideClusterInfo details.
"""

from __future__ import annotations

import functools
import logging.handlers
import os
import shutil
import string
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.k8s.errors import CredentialError, KubeconfigError, one_line

Headers = tuple[tuple[str, str], ...]  # names may repeat

# RFC 7230 token characters: what a header name may hold. client-go percent-encodes
# everything else in an extra's key, and "%" itself so that decoding is unambiguous.
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$&'*+-.^_`|~")


@dataclass(frozen=True)
class Loaded:
    """A Configuration and what we add to it."""

    configuration: Any  # kubernetes.client.Configuration
    impersonate: Headers = ()


def load(path: str | None) -> Loaded:
    """`path` (a kubeconfig, or several joined by os.pathsep); with None, the pod's service
    account when running in a pod, else $KUBECONFIG or ~/.kube/config."""
    if path:
        return load_kubeconfig(path)
    incluster, why_not = load_incluster()
    if incluster is not None:
        return incluster
    default = os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        return load_kubeconfig(default)
    except KubeconfigError as exc:
        if any(os.path.isfile(os.path.expanduser(p)) for p in default.split(os.pathsep) if p):
            raise
        raise KubeconfigError(f"not running in a pod ({why_not}) and {exc}") from exc


def load_incluster() -> tuple[Loaded | None, str]:
    """The service account's config, or None and why not (no service env, no token or CA
    file: not in a pod), for the caller to try a kubeconfig."""
    from kubernetes import client
    from kubernetes.config import load_incluster_config

    cfg = client.Configuration()
    try:
        load_incluster_config(cfg)
    except Exception as exc:  # ConfigException, or a file that vanished meanwhile
        return None, one_line(exc).rstrip(".")
    return Loaded(cfg), ""


def load_kubeconfig(paths: str) -> Loaded:
    """The current context of the kubeconfig files in `paths`."""
    from kubernetes.config import kube_config

    try:
        merger = kube_config.KubeConfigMerger(paths)
    except Exception as exc:  # yaml's errors, an empty file, not a mapping
        # The file yaml failed in, when it says (the merger reads several).
        name = getattr(getattr(exc, "problem_mark", None), "name", None)
        where = str(name) if name and os.path.isfile(str(name)) else paths
        raise KubeconfigError(f"kubeconfig {where}: {_problem(exc, 'not a kubeconfig')}") from exc
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

    at = f"kubeconfig {paths}"
    # The first file's current-context, as kubectl reads merged files (the merger: the last's).
    docs = merger.config_files.values()
    current = next((d["current-context"] for d in docs if d.get("current-context")), None)
    if current is None:
        raise KubeconfigError(f"{at}: no current-context set")
    loader = kube_config.KubeConfigLoader(merger.config, str(current), config_base_path=None)
    context, cluster, user = loader._current_context["context"], loader._cluster, loader._user
    # The loader's checks stop short of these: without a server it keeps the
    # Configuration's default (http://localhost), and it takes any scheme.
    server = str(cluster.safe_get("server") or "")
    if not server:
        raise KubeconfigError(f"{at}: the cluster {context['cluster']!r} has no server")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"{at}: server {server!r} is not an http(s) URL")
    where = f"{at}, user {context.safe_get('user')!r}"
    body: dict[str, Any] = user.value if user is not None else {}
    headers = impersonation(body, where)

    cfg = client.Configuration()
    if body.get("exec"):  # run where the library runs it: beside the cluster's file
        _raise_exec_failures(loader, user["exec"], os.path.dirname(os.path.abspath(cluster.path)))
    try:
        loader.load_and_set(cfg)
    except CredentialError as exc:
        raise KubeconfigError(f"{where}: {exc}") from exc
    if body.get("tokenFile") and not any(body.get(k) for k in ("auth-provider", "token")):
        path = os.path.join(os.path.dirname(os.path.abspath(user.path)), str(body["tokenFile"]))
        cfg.refresh_api_key_hook = functools.partial(_read_token_file, os.path.normpath(path))
    if cluster.safe_get("proxy-url"):
        cfg.no_proxy = None
    return Loaded(cfg, impersonate=headers)


def impersonation(user: Mapping[str, Any], where: str) -> Headers:
    """The Impersonate-* headers for `user` (a kubeconfig user's body); `where` names the
    kubeconfig and the user in errors."""
    name, uid = user.get("as"), user.get("as-uid")
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not name and (uid or groups or extra):
        raise KubeconfigError(f"{where}: as-uid, as-groups or as-user-extra without `as` (a user)")
    if not isinstance(groups, list) or not isinstance(extra, Mapping):
        raise KubeconfigError(f"{where}: as-groups must be a list and as-user-extra a mapping")
    out = [("Impersonate-User", str(name))] if name else []
    out += [("Impersonate-Uid", str(uid))] if uid else []
    out += [("Impersonate-Group", str(g)) for g in groups]
    for key, values in extra.items():
        for v in values if isinstance(values, list) else [values]:
            out.append((f"Impersonate-Extra-{escape_key(str(key))}", str(v)))
    return tuple(out)


def escape_key(key: str) -> str:
    """An extra's key as part of a header name ("scopes.example.com/x" ->
    "scopes.example.com%2Fx"), byte by byte over its UTF-8."""
    return "".join(chr(b) if chr(b) in _TOKEN else f"%{b:02X}" for b in key.encode())


def _raise_exec_failures(loader: Any, exec_node: Any, cwd: str) -> None:
    """Makes the library's loader raise an exec plugin's failure (CredentialError), at load
    and at each renewal, where it would log it and go on without credentials."""
    load = loader._load_from_exec_plugin

    def load_or_raise() -> bool:
        # What this thread logs at ERROR meanwhile: the library logs a plugin's failure there.
        said = logging.handlers.BufferingHandler(capacity=100)
        said.setLevel(logging.ERROR)
        thread = threading.get_ident()
        said.addFilter(lambda record: record.thread == thread)
        logging.getLogger().addHandler(said)
        try:
            if load():
                return True
        finally:
            logging.getLogger().removeHandler(said)
        command = str(exec_node.safe_get("command") or "")
        why = "; ".join(" ".join(r.getMessage().split()) for r in said.buffer)
        # The library's own failures start "exec: "; an OSError means it could not start.
        path = os.path.join(cwd, command) if "/" in command else command
        if not why.startswith("exec: ") and command and not shutil.which(path):
            hint = " ".join(str(exec_node.safe_get("installHint") or "").split())
            why = "not found" + (f" ({hint})" if hint else "")
        why = why.removeprefix("exec: ") or "gave no credential"
        raise CredentialError(f"exec plugin {command}: {why}" if command else f"exec: {why}")

    loader._load_from_exec_plugin = load_or_raise


def _read_token_file(path: str, cfg: Any) -> None:
    """The refresh hook of a kubeconfig's tokenFile (auth.py runs it once a second at most)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"token file {path}: {one_line(exc)}") from exc
    if not token:
        raise CredentialError(f"token file {path} is empty")
    cfg.api_key["BearerToken"] = f"Bearer {token}"


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


def _problem(exc: BaseException, otherwise: str) -> str:
    import yaml

    if isinstance(exc, yaml.YAMLError):
        return f"not valid YAML: {one_line(exc)}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or one_line(exc)}: {exc.filename}"
    if type(exc).__name__ == "ConfigException":
        return one_line(exc)
    return f"{otherwise} ({type(exc).__name__}: {one_line(exc)})"
