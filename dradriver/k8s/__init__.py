"""The Kubernetes API edge: `Kube`, a thin client that exchanges plain JSON dicts with the
API server, and its typed errors.

Configuration and credentials come from the official `kubernetes` library's loaders, the
requests go through urllib3 on the pool that library builds; what it lacks is added
thinly (config.py and auth.py list it). The library is imported when the first Kube is
made, never by importing this package.

Any layer may import this package (`from dradriver.k8s import ...`); only this package
imports `kubernetes` or urllib3, and its modules import nothing of dradriver but
dradriver.api.depth and dradriver.logs.
"""

from dradriver.k8s.client import Kube, path_for
from dradriver.k8s.errors import (
    Conflict,
    Forbidden,
    Gone,
    KubeconfigError,
    KubeError,
    NotFound,
    TooManyRequests,
    Unauthorized,
)

__all__ = [
    "Conflict",
    "Forbidden",
    "Gone",
    "Kube",
    "KubeError",
    "KubeconfigError",
    "NotFound",
    "TooManyRequests",
    "Unauthorized",
    "path_for",
]
