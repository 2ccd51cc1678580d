"""The latest discovery and what it publishes (DeviceView), shared by publishing and
prepare: both see the same devices, health-tainted, with the partitions our claims hold
counted as ours."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from dradriver import logs
from dradriver.inventory.node_devices import MigMode, MigSwitching, NodeDevice, Skipped
from dradriver.inventory.versions import mps_protocol
from dradriver.k8s.lines import OLDEST, Line
from dradriver.kubeletplugin.device_view.health import NodeHealth
from dradriver.nvml.library import Nvml
from dradriver.slices.build import SliceContent, build
from dradriver.slices.consumable import OFF, Consumable, ConsumableMode
from dradriver.slices.imex import channel_slice, node_clique

log = logs.get_logger("kubeletplugin")


@dataclass(eq=False)
class DeviceView:
    """Refreshed by the publish loop; read by prepare (devices) and MIG (profiles).
    `owned` runs on the publish thread, without the node lock: the state package's
    checkpoint_owned()."""

    nvml: Nvml
    mode: MigMode
    owned: Callable[[], set[tuple[str, int, int]]] = set
    _: KW_ONLY
    switching: MigSwitching = MigSwitching.ON_DEMAND
    held: Callable[[set[tuple[str, int, int]]], set[tuple[str, int, int]]] = lambda o: set()
    offered_profiles: frozenset[str] = frozenset()
    health: NodeHealth | None = None
    consumable: Consumable = OFF
    # Shares on a driver without MPS v3 (no isolation between their tenants): offered
    # only when asked for (--mps-v2-shares allow).
    mps_v2_shares: bool = False
    imex_channels: bool = False
    # The API server's Kubernetes line, which the slices are laid out for.
    line: Callable[[], Line] = lambda: OLDEST
    # Whether the channel device names binding conditions: set once the API server
    # is known to keep them (imex_binding/probe.py), then the next refresh publishes them.
    imex_binding: bool = field(default=False, init=False)
    discovered: threading.Event = field(default_factory=threading.Event, init=False)
    last_error: str = field(default="not discovered yet", init=False)
    # From the latest discovery: the node's fabric clique, the NVIDIA driver's version
    # and the same as NVML says it (Inventory.driver_release), the GPUs left out.
    clique: str | None = field(default=None, init=False)
    driver_version: str = field(default="", init=False)
    driver_release: str = field(default="", init=False)
    skipped: list[Skipped] = field(default_factory=list, init=False)
    # Every device by name, replaced whole (never changed in place) by each refresh.
    _index: dict[str, NodeDevice] = field(default_factory=dict, init=False)
    _shares_said: str = field(default="", init=False)
    _unknown_profiles: frozenset[str] = field(default=frozenset(), init=False)
    _no_channels: str = field(default="", init=False)

    def refresh(self) -> list[SliceContent]:
        try:
            found = self.nvml.discover()
        except Exception as exc:
            self.last_error = str(exc)
            raise
        for problem in found.problems:
            log.error("GPU problem", detail=problem)
        owned = self.owned()
        inv = found.inventory
        self.driver_version, self.driver_release = inv.driver_version, inv.driver_release
        if self.health is not None:
            # An unhealthy GPU NVML cannot describe any more stays published, tainted.
            inv = self.health.inventory(inv)
        built = build(
            inv,
            self.mode,
            owned,
            switching=self.switching,
            held_mig=self.held(owned),
            profiles=self.offered_profiles,
            consumable=self._consumable(inv.driver_version),
            line=self.line(),
        )
        slices = built.slices
        if self.health is not None:
            slices = self.health.taint(slices, built.offer.devices().values())
        self.clique = node_clique(found.inventory)
        if self.imex_channels:
            channels, why_not = channel_slice(found.inventory, self.imex_binding)
            if channels is not None:
                slices = [*slices, channels]
            elif why_not != self._no_channels:
                log.info("no IMEX channels published", reason=why_not)
            self._no_channels = why_not
        if self.offered_profiles and self.mode is MigMode.DYNAMIC:
            known = {p.name for g in found.inventory.gpus for p in g.mig_profiles}
            unknown = self.offered_profiles - known
            if unknown != self._unknown_profiles and unknown:
                # A typo, or a product this node does not have: say it once.
                log.warning(
                    "--mig-profiles names profiles no GPU of this node has",
                    unknown=",".join(sorted(unknown)),
                    known=",".join(sorted(known)),
                )
            self._unknown_profiles = frozenset(unknown)
        for skip in built.skipped:
            log.warning(
                "GPU not published as a whole",
                gpu=skip.uuid,
                reason=skip.reason,
                detail=skip.message,
            )
        self.skipped, self._index = built.skipped, built.offer.devices()
        self.last_error = ""
        self.discovered.set()
        return slices

    def _consumable(self, driver: str) -> Consumable:
        """What is shared: nothing on a driver before r615 unless --mps-v2-shares allow
        (said once per driver)."""
        if self.consumable.mode is ConsumableMode.OFF or mps_protocol(driver) == 3:
            return self.consumable
        if driver != self._shares_said:
            self._shares_said = driver
            if self.mps_v2_shares:
                log.warning(
                    "shares of a GPU on a driver before r615 (MPS v2): their limits are the "
                    "clients' own variables, and every share's container gets the device "
                    "daemon's whole pipe directory (it can stop the daemon); give one GPU's "
                    "shares to one tenant (docs/user-guide.md, shares)",
                    driver=driver,
                )
            else:
                log.error(
                    "no shares of a GPU on this node: its driver is older than r615 (MPS v2), "
                    "which cannot isolate shares from one another; the GPUs are published "
                    "whole. Fix: a driver r615+, or --mps-v2-shares allow (Helm "
                    "kubeletPlugin.mpsV2Shares) to share them within one tenant",
                    driver=driver,
                )
        return self.consumable if self.mps_v2_shares else OFF

    def devices(self) -> dict[str, NodeDevice]:
        return dict(self._index)

    def profiles(self) -> dict[str, list[int]]:
        """GPU UUID -> its MIG profile IDs, for finding MIG instances."""
        return {
            d.gpu.uuid: [p.profile_id for p in d.gpu.mig_profiles]
            for d in self.devices().values()
            if d.gpu.mig_profiles
        }
