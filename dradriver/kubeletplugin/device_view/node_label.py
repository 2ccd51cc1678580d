"""The Node's fabric-clique label (gpu.dradriver.io/nvlink-domain=<clusterUuid>.<cliqueId>),
so that a job's pods can share a clique through podAffinity's topologyKey; kept in step
with discovery, written only when the clique changes, off the publish path. When it goes
stale: docs/design.md, "The Node's fabric-clique label".
"""

from __future__ import annotations

import threading

from dradriver.api.computedomain import NVLINK_DOMAIN_LABEL
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.node_label")


class NodeLabel:
    def __init__(self, kube: Kube, node: str) -> None:
        self.kube, self.node = kube, node
        self._lock = threading.Lock()
        self._written: str | None = None  # the value on the Node as we last wrote it
        self._wanted: str | None = None
        self._busy = False

    def sync(self, clique: str | None) -> None:
        """Called after each discovery: labels the Node with `clique` (None: takes our
        label off if we set it, and does nothing otherwise)."""
        with self._lock:
            self._wanted = clique
            if clique == self._written or self._busy:
                return
            self._busy = True
        threading.Thread(target=self._write, name="node-label", daemon=True).start()

    def _write(self) -> None:
        while True:
            with self._lock:
                want = self._wanted
                if want == self._written:
                    self._busy = False
                    return
            try:
                self.kube.patch(
                    path_for("v1", "nodes", name=self.node),
                    {"metadata": {"labels": {NVLINK_DOMAIN_LABEL: want}}},
                )
            except KubeError as exc:
                log.warning(
                    "cannot label the node with its fabric clique; its pods cannot use it "
                    "as a podAffinity topologyKey (the chart grants this patch)",
                    node=self.node,
                    label=NVLINK_DOMAIN_LABEL,
                    value=want,
                    error=exc.message or str(exc),
                )
                with self._lock:
                    self._busy = False
                return
            log.info("node labelled", node=self.node, label=NVLINK_DOMAIN_LABEL, value=want)
            with self._lock:
                self._written = want
