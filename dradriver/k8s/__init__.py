"""The Kubernetes API edge: a small JSON client over the official library's auth and transport."""

from dradriver.k8s.client import Conflict, Kube, KubeError, NotFound, path_for

__all__ = ["Conflict", "Kube", "KubeError", "NotFound", "path_for"]
