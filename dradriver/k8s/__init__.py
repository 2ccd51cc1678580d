"""The Kubernetes API edge: a small JSON client with its own kubeconfig loading and
connection pool (the official library only for the auth it alone implements)."""

from dradriver.k8s.client import Conflict, Kube, KubeError, NotFound, path_for
from dradriver.k8s.config import ConfigError

__all__ = ["ConfigError", "Conflict", "Kube", "KubeError", "NotFound", "path_for"]
