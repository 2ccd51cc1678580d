"""The name book: which GPU each device name this node published stood for.

Kept in the state directory (device-names.json) so that it outlives the GPU: once a GPU
is gone, its name still says what it was, and prepare can tell a claim allocated to it
that its GPU is gone rather than hand it whatever now answers to the name. A name is
never forgotten (a node sees a few GPUs in its life); a damaged file is set aside and
the book starts again from what is published now."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from dradriver.inventory.model import Gpu
from dradriver.inventory.naming import GpuIdentity
from dradriver.inventory.node_devices import gpu_device_name
from dradriver.kubeletplugin.state.files import atomic_write
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.names")
VERSION = 1


class NameBook:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._names: dict[str, GpuIdentity] = self._read()

    def _read(self) -> dict[str, GpuIdentity]:
        try:
            doc = json.loads(self.path.read_bytes())
            return {
                str(name): GpuIdentity(
                    str(e["uuid"]), str(e.get("pciBusId", "")), str(e.get("product", ""))
                )
                for name, e in doc["names"].items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(self.path.name + ".damaged")
            try:
                self.path.replace(aside)
            except OSError:
                aside = self.path
            log.warning(
                "device name book unreadable; started again from the devices published now",
                path=str(self.path),
                kept_as=str(aside),
                error=str(exc),
            )
            return {}

    def snapshot(self) -> Mapping[str, GpuIdentity]:
        """The book as it stands: a change replaces the dict, never edits it, so a
        prepare reads it without a copy or the lock."""
        return self._names

    def learn(self, gpus: Iterable[Gpu]) -> None:
        """Records the names of the GPUs published now; a name already bound to another
        GPU is re-bound (it is what the slices say from now on) and logged."""
        found = {gpu_device_name(g): GpuIdentity.of(g) for g in gpus}
        with self._lock:
            changed = {n: i for n, i in found.items() if self._names.get(n) != i}
            if not changed:
                return
            for name, ident in changed.items():
                if (before := self._names.get(name)) is not None and before.uuid != ident.uuid:
                    log.warning(
                        "device name now stands for another GPU",
                        device=name,
                        was=before.uuid,
                        now=ident.uuid,
                    )
            self._names = {**self._names, **changed}
            names = {
                n: {"uuid": i.uuid, "pciBusId": i.pci_bus_id, "product": i.product}
                for n, i in sorted(self._names.items())
            }
            data = json.dumps({"version": VERSION, "names": names}, indent=1).encode() + b"\n"
            try:
                atomic_write(self.path, data)
            except OSError as exc:
                # Kept in memory: prepare still checks against it until the next start.
                log.warning("cannot save the device name book", path=str(self.path), error=str(exc))
