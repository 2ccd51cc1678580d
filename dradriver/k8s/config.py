"""Where the API server is and how to authenticate to it: a kubeconfig or the pod's
service account, read into one typed record without the official client library.

Importing `kubernetes` costs ~400 ms and ~32 MiB, more than the kubelet plugin may spend
starting. So the common cases (token, token file, client certificate, exec plugins, the
in-cluster service account) are read here; only what we do not implement (the deprecated
auth-provider, exec plugins of another API version) goes to the official loader.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_KUBECONFIG = "~/.kube/config"
# client-go's exec protocol versions; v1alpha1 is gone from client-go too.
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ConfigError(ValueError):
    """The config cannot be used; str() is one line naming the file and the problem.

    A ValueError so callers that caught the official library's errors as ValueError still
    catch it."""


@dataclass(frozen=True)
class ClientCert:
    """A client certificate and key, each a PEM file or PEM bytes."""

    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


@dataclass(frozen=True)
class ExecConfig:
    """A client-go credential plugin (`users[].user.exec`)."""

    command: str
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    base_dir: str = ""  # the kubeconfig's directory: the plugin runs there
    install_hint: str = ""
    # spec.cluster of KUBERNETES_EXEC_INFO, when provideClusterInfo is set.
    cluster: dict[str, Any] | None = None


@dataclass(frozen=True)
class KubeConfig:
    """One API server and one identity: what the transport and the credentials need."""

    server: str  # scheme://host[:port][/prefix], no trailing slash
    ca_file: str | None = None
    ca_data: bytes | None = None  # PEM, or DER
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    token: str | None = None
    token_file: str | None = None  # re-read when it changes: bound tokens rotate
    username: str | None = None
    password: str | None = None
    client_cert: ClientCert | None = None
    exec: ExecConfig | None = None
    # The official library's Configuration, for what only it can authenticate (its
    # refresh hook yields the Authorization header). Kept out of equality and repr.
    legacy: Any = field(default=None, compare=False, repr=False)

    def with_token(self, token: str) -> KubeConfig:
        """The same server and trust, authenticated by `token` alone."""
        return KubeConfig(
            server=self.server,
            ca_file=self.ca_file,
            ca_data=self.ca_data,
            insecure=self.insecure,
            tls_server_name=self.tls_server_name,
            proxy_url=self.proxy_url,
            token=token,
        )


def load(path: str | None) -> KubeConfig:
    """`path` (a kubeconfig, or several joined by os.pathsep); with None, the pod's service
    account when running in a pod, else $KUBECONFIG or ~/.kube/config."""
    if path:
        return load_kubeconfig(path)
    incluster = load_incluster()
    if incluster is not None:
        return incluster
    default = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    try:
        return load_kubeconfig(default)
    except ConfigError as exc:
        if _existing(default):
            raise
        raise ConfigError(f"not running in a pod and {exc}") from exc


def load_incluster(
    environ: dict[str, str] | None = None, sa_dir: str | None = None
) -> KubeConfig | None:
    """The service account's config, or None when not in a pod (no service env, no token
    or CA file): the caller then tries a kubeconfig, as the official library does."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    sa = Path(sa_dir or SERVICE_ACCOUNT_DIR)
    token, ca = sa / "token", sa / "ca.crt"
    try:
        if not token.read_bytes().strip() or not ca.read_bytes().strip():
            return None
    except OSError:
        return None
    if ":" in host or "%" in host:
        host = f"[{host}]"
    return KubeConfig(server=f"https://{host}:{port}", ca_file=str(ca), token_file=str(token))


def load_kubeconfig(paths: str) -> KubeConfig:
    """The current context of the kubeconfig files in `paths` (os.pathsep-separated),
    merged as kubectl does: the first file to name a cluster, user, context or the
    current-context wins."""
    files = _existing(paths)
    if not files:
        raise ConfigError(f"no kubeconfig at {paths}: no such file")
    merged = _merge(files)
    name = merged.current
    if not name:
        raise ConfigError(f"kubeconfig {paths}: no current-context set")
    ctx = merged.named("contexts", name, paths)
    cluster = merged.named("clusters", str(ctx.get("cluster") or ""), paths)
    user = merged.named("users", str(ctx["user"]), paths) if ctx.get("user") else {}
    if _needs_official_loader(user):
        from dradriver.k8s.legacy import load_with_official_library

        return load_with_official_library(paths)
    try:
        return _record(cluster, user)
    except ConfigError as exc:
        raise ConfigError(f"kubeconfig {paths}, context {name}: {exc}") from exc


def _existing(paths: str) -> list[Path]:
    out = []
    for p in paths.split(os.pathsep):
        if p and (path := Path(p).expanduser()).is_file():
            out.append(path)
    return out


class _Merged:
    def __init__(self) -> None:
        self.current = ""
        # kind -> name -> (the entry's body, the directory relative paths start from)
        self.entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
            "clusters": {},
            "users": {},
            "contexts": {},
        }

    def named(self, kind: str, name: str, paths: str) -> dict[str, Any]:
        found = self.entries[kind].get(name)
        if found is None:
            raise ConfigError(f"kubeconfig {paths}: no {kind[:-1]} named {name!r}")
        body, base = found
        return {**body, "__base__": base}


def _merge(files: list[Path]) -> _Merged:
    import yaml  # only kubeconfigs need it, not the in-cluster config

    merged = _Merged()
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"kubeconfig {f}: cannot read: {exc}") from exc
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise ConfigError(f"kubeconfig {f}: not valid YAML: {problem}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {f}: empty or not a mapping")
        if not merged.current and doc.get("current-context"):
            merged.current = str(doc["current-context"])
        for kind, body_key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for item in doc.get(kind) or []:
                if not isinstance(item, dict) or "name" not in item:
                    raise ConfigError(f"kubeconfig {f}: a {body_key} without a name")
                body = item.get(body_key) or {}
                if not isinstance(body, dict):
                    what = f"{body_key} {item['name']!r}"
                    raise ConfigError(f"kubeconfig {f}: {what} is not a mapping")
                merged.entries[kind].setdefault(str(item["name"]), (body, f.parent.resolve()))
    return merged


def _needs_official_loader(user: dict[str, Any]) -> bool:
    """What only the official library implements: the deprecated auth-provider (gcp, oidc),
    and exec plugins of a protocol version client-go no longer speaks. The official
    loader checks the auth-provider first, so a user with one goes there whole."""
    if user.get("auth-provider"):
        return True
    exec_ = user.get("exec")
    has_token = bool(user.get("token") or user.get("tokenFile"))
    return (
        isinstance(exec_, dict)
        and not has_token
        and exec_.get("apiVersion") not in EXEC_API_VERSIONS
        and exec_.get("apiVersion") is not None
    )


def _record(cluster: dict[str, Any], user: dict[str, Any]) -> KubeConfig:
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError("the cluster has no server")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"server {server!r} is not an http(s) URL")
    cbase, ubase = cluster["__base__"], user.get("__base__", cluster["__base__"])
    # TLS material only matters for https, and the official loader reads it only then.
    https = server.startswith("https://")
    token = str(user["token"]) if user.get("token") else None
    token_file = None if token else _file(user, "tokenFile", ubase)
    if token_file is not None:
        try:
            Path(token_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"tokenFile: {exc.strerror or exc}: {token_file}") from exc
    # Checked in the official loader's order (token, then exec, then basic): an exec
    # section the token overrides is never run, so it need not even be valid.
    exec_ = None
    if user.get("exec") and not token and not token_file:
        exec_ = _exec(user["exec"], ubase, cluster)
    proxy = str(cluster["proxy-url"]) if cluster.get("proxy-url") else None
    if proxy is not None and not proxy.startswith("http://"):
        raise ConfigError(f"proxy-url {proxy!r}: only http:// proxies are supported")
    basic = user.get("username") is not None and user.get("password") is not None
    return KubeConfig(
        server=server,
        ca_file=_file(cluster, "certificate-authority", cbase, must_exist=True) if https else None,
        ca_data=_data(cluster, "certificate-authority-data") if https else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        proxy_url=proxy,
        token=token,
        token_file=token_file,
        username=str(user["username"]) if basic else None,
        password=str(user["password"]) if basic else None,
        client_cert=_client_cert(user, ubase) if https else None,
        exec=exec_,
    )


def _file(obj: dict[str, Any], key: str, base: Path, must_exist: bool = False) -> str | None:
    value = obj.get(key)
    if not value:
        return None
    path = str(base / Path(str(value)).expanduser())
    if must_exist and not os.path.isfile(path):
        raise ConfigError(f"{key} {path}: no such file")
    return path


def _data(obj: dict[str, Any], key: str) -> bytes | None:
    value = obj.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=False)
    except ValueError as exc:
        raise ConfigError(f"{key} is not base64: {exc}") from exc


def _client_cert(user: dict[str, Any], base: Path) -> ClientCert | None:
    cert = ClientCert(
        cert_file=_file(user, "client-certificate", base, must_exist=True),
        key_file=_file(user, "client-key", base, must_exist=True),
        cert_pem=_data(user, "client-certificate-data"),
        key_pem=_data(user, "client-key-data"),
    )
    has_cert = cert.cert_file or cert.cert_pem
    has_key = cert.key_file or cert.key_pem
    if not has_cert and not has_key:
        return None
    if not has_cert or not has_key:
        raise ConfigError("the user has a client certificate without its key, or a key alone")
    return cert


def _exec(spec: Any, base: Path, cluster: dict[str, Any]) -> ExecConfig:
    if not isinstance(spec, dict) or not spec.get("command"):
        raise ConfigError("exec: no command")
    if not spec.get("apiVersion"):
        raise ConfigError("exec: no apiVersion")
    env = []
    for item in spec.get("env") or []:
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError("exec: an env entry without a name")
        env.append((str(item["name"]), str(item.get("value", ""))))
    info: dict[str, Any] | None = None
    if spec.get("provideClusterInfo"):
        info = {k: v for k, v in cluster.items() if k != "__base__" and k != "extensions"}
        if ca := cluster.get("certificate-authority"):
            info.pop("certificate-authority", None)
            try:
                pem = (cluster["__base__"] / str(ca)).read_bytes()
            except OSError as exc:
                raise ConfigError(f"exec: cannot read the cluster CA {ca}: {exc}") from exc
            info["certificate-authority-data"] = base64.b64encode(pem).decode()
        for ext in cluster.get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                info["config"] = ext.get("extension")
    command = str(spec["command"])
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)  # as client-go: relative to the kubeconfig
    return ExecConfig(
        command=command,
        api_version=str(spec["apiVersion"]),
        args=tuple(str(a) for a in spec.get("args") or ()),
        env=tuple(env),
        base_dir=str(base),
        install_hint=str(spec.get("installHint") or ""),
        cluster=info,
    )
