"""The node's IMEX daemon for a ComputeDomain's channel: checked against the domain, then
started with every node of the domain as its peers, waited for until it answers READY,
stopped at unprepare. Why only once every node is known, and how each step is recorded:
docs/design.md, "IMEX channels and daemons".
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.errors import DaemonError, ImexError
from dradriver.kubeletplugin.daemons import Daemons
from dradriver.kubeletplugin.daemons.spec import CLAIM, DOMAIN, DaemonRef, DaemonSpec, imex_name
from dradriver.kubeletplugin.state.ledger import Ledger
from dradriver.kubeletplugin.state.records import ClaimRecord, ImexDaemon
from dradriver.logs import get_logger
from dradriver.nvml.host import GpuHost

log = get_logger("kubeletplugin.imex")

# The reason of the one ImexError that is a wait, not a failure: the domain's other
# nodes have not joined yet (imex_binding/ reports it as a False condition, not a failure).
WAITING = "imex_waiting"
# What happens next, said at the end of a message at prepare (prebind says its own).
KUBELET_RETRIES = "the kubelet retries"
Obj = dict[str, Any]


def peers_of(domain: Obj, node: str, uid: str) -> tuple[str, tuple[str, ...]] | str:
    """(this node's address, every node's address) from the domain's status, or what
    is still missing."""
    want = int((domain.get("spec") or {}).get("numNodes") or 0)
    nodes = [n for n in (domain.get("status") or {}).get("nodes") or [] if isinstance(n, dict)]
    joined = sorted(str(n.get("name")) for n in nodes)
    mine = next((n for n in nodes if n.get("name") == node), None)
    if mine is None or not mine.get("address"):
        return (
            f"the ComputeDomain controller has not listed this node ({node}) in the domain "
            f"yet (joined: {', '.join(joined) or 'none'})"
        )
    if len(nodes) < want:
        return f"{len(nodes)} of {want} nodes of the domain have joined ({', '.join(joined)})"
    if missing := [str(n.get("name")) for n in nodes if not n.get("address")]:
        return f"no IMEX address known for {', '.join(missing)}"
    # Each address becomes a line of the daemon's nodes_config: only an IP address may.
    if bad := [str(n.get("name")) for n in nodes if cd.ip_address(n["address"]) is None]:
        return (
            f"the ComputeDomain's status gives {', '.join(bad)} an address that is not an IP "
            "address; the controller writes it from each Node's InternalIP or its "
            f"{cd.IMEX_ADDRESS_LABEL} label"
        )
    return str(mine["address"]), tuple(sorted(str(n["address"]) for n in nodes))


# Makes a daemon's progress durable (in its claim's record, or nowhere before prepare).
Record = Callable[[ImexDaemon], None]


def _with_imex(rec: ClaimRecord, i: int, im: ImexDaemon) -> ClaimRecord:
    return rec.with_device(i, dataclasses.replace(rec.devices[i], imex=im))


def _saving(rec: ClaimRecord, i: int, save: Callable[[ClaimRecord], None]) -> Record:
    """Saves `rec` with its `i`th device's daemon as each step leaves it."""
    return lambda im: save(_with_imex(rec, i, im))


@contextlib.contextmanager
def _as_imex(what: str = "IMEX daemon") -> Iterator[None]:
    """A daemon's failure, told as the IMEX layer's."""
    try:
        yield
    except DaemonError as exc:
        raise ImexError(f"{what}: {exc}", reason=exc.reason) from exc


def _same(cfg_dir: Path, files: dict[str, str]) -> bool:
    """Whether the daemon's directory holds these files (the daemon reads them once)."""
    try:
        return all((cfg_dir / name).read_text() == text for name, text in files.items())
    except OSError:
        return False


@dataclasses.dataclass
class ImexSteps:
    host: GpuHost
    daemons: Daemons  # where the IMEX daemons run (their pods)
    node: str
    state_dir: Path
    # GET of the claim's ComputeDomain (namespace, name); raises ImexError.
    domain_of: Callable[[str, str], Obj]
    clique: Callable[[], str | None]  # the node's fabric clique now
    port: int  # --imex-port
    cmd_port: int  # --imex-cmd-port
    # The daemon's pod started and READY: the image is the plugin's own, already on the node.
    ready_timeout: float = 20.0

    def __post_init__(self) -> None:
        # Which claim each daemon was started for, should the checkpoint be lost (and,
        # before prepare, the binder's only record of it).
        self.ledger = Ledger.of(self.state_dir)

    def apply(self, rec: ClaimRecord, save: Callable[[ClaimRecord], None]) -> ClaimRecord:
        """The claim's IMEX daemons started; `save(rec)` makes each step durable. The
        record after."""
        for i, d in enumerate(rec.devices):
            if d.imex is not None:
                im = self.check(d.imex, KUBELET_RETRIES)
                record = _saving(rec, i, save)
                im = self._launch(rec.uid, rec.ref, im, record=record, then=KUBELET_RETRIES)
                rec = _with_imex(rec, i, im)
        return rec

    def prebind(self, uid: str, ref: str, im: ImexDaemon) -> None:
        """Before the pod is bound (binding conditions, kubeletplugin/imex_binding/): the same
        checks and daemon as at prepare, which then adopts it. The ledger is its only
        record (no checkpoint entry before prepare): the binder's sweep stops a daemon
        whose claim is neither prepared nor allocated here."""
        im = self.check(im, "the scheduler holds the pod until then")
        then = "the scheduler places the pod again"
        try:
            self._launch(uid, ref, im, record=lambda im: None, then=then)
        except ImexError:
            self.undo_forgotten(uid)
            raise

    def check(self, im: ImexDaemon, then: str) -> ImexDaemon:
        """The claim's domain is the one it was made for, in this node's clique, with
        its channel; every node has joined: the daemon with its address and peers."""
        where = f"ComputeDomain {im.namespace}/{im.domain}"
        domain = self.domain_of(im.namespace, im.domain)
        uid = (domain.get("metadata") or {}).get("uid")
        if uid != im.domain_uid:
            raise ImexError(
                f"{where} is not the domain the claim was made for (uid {uid}, the claim's "
                f"config names {im.domain_uid}): it was deleted and made again; delete the "
                "job's pods so that their claims are made from the new domain's template",
                reason="imex_domain_replaced",
            )
        status = domain.get("status") or {}
        mine, theirs = self.clique(), status.get("clique")
        if theirs != mine:
            raise ImexError(
                f"{where} is in fabric clique {theirs}, but this node ({self.node}) is in "
                f"{mine or 'no clique'}: its GPUs cannot reach the domain's over NVLink",
                reason="imex_wrong_clique",
            )
        if status.get("channel") != im.channel:
            raise ImexError(
                f"{where} holds IMEX channel {status.get('channel')}, not the claim's "
                f"{im.channel}: the claim was made from an older template of it",
                reason="imex_wrong_channel",
            )
        found = peers_of(domain, self.node, im.domain_uid)
        if isinstance(found, str):
            raise ImexError(
                f"{where}: waiting for its nodes before starting this node's IMEX daemon: "
                f"{found}; {then}",
                reason=WAITING,
            )
        address, peers = found
        return dataclasses.replace(im, address=address, peers=peers)

    def _launch(
        self, uid: str, ref: str, im: ImexDaemon, *, record: Record, then: str
    ) -> ImexDaemon:
        """The daemon of `im` started (or adopted, its files unchanged) and READY."""
        cfg_dir = self.state_dir / "imex" / im.domain_uid
        config, nodes = cfg_dir / "config.cfg", cfg_dir / "nodes_config.cfg"
        # Written in this order: a directory without its config is one a crash interrupted.
        files = {
            "nodes_config.cfg": "".join(f"{p}\n" for p in im.peers),
            # The IMEX guide, "IMEX Service Config Options".
            "config.cfg": (
                "# Written by the dradriver kubelet plugin for ComputeDomain "
                f"{im.namespace}/{im.domain} ({im.domain_uid}), channel {im.channel}\n"
                "DAEMONIZE=0\n"
                f"BIND_INTERFACE_IP={im.address}\n"
                f"SERVER_PORT={self.port}\n"
                f"IMEX_NODE_CONFIG_FILE={nodes}\n"
                "IMEX_CMD_ENABLED=1\n"
                f"IMEX_CMD_PORT={self.cmd_port}\n"
            ),
        }
        said = "IMEX daemon adopted"  # started before the pod was bound, for this claim
        if self.ledger.load().imex.get(im.domain_uid) != uid or not _same(cfg_dir, files):
            # The daemon reads its config once: one of an older start, with another
            # peer list (or for another claim), goes before the new config is written.
            self._stop(DaemonRef(imex_name(im.domain_uid, self.node)))
            im = dataclasses.replace(im, config_dir=str(cfg_dir), daemon=None)
            record(im)  # the intent: a crash from here leaves a directory to clean
            self.ledger.imex_starting(im.domain_uid, uid)
            cfg_dir.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (cfg_dir / name).write_text(text)
            said = "IMEX daemon started"
        im = self._start(uid, ref, dataclasses.replace(im, config_dir=str(cfg_dir)), said=said)
        record(im)
        answer = ["no answer"]

        def ready() -> bool:
            ok, answer[0] = self.host.imex_ready(config)
            return ok

        assert im.daemon is not None
        try:
            self.daemons.wait(im.daemon, ready, timeout=self.ready_timeout)
        except DaemonError as exc:
            raise ImexError(
                f"ComputeDomain {im.namespace}/{im.domain}: this node's IMEX daemon did not "
                f"answer READY (nvidia-imex-ctl -q: {answer[0] or 'no answer'}): {exc}; it is "
                f"stopped and {then}",
                reason="imex_not_ready",
            ) from exc
        return im

    def _start(self, uid: str, ref: str, im: ImexDaemon, *, said: str) -> ImexDaemon:
        """The daemon's pod, made, or found running (and then adopted)."""
        assert im.config_dir is not None
        spec = DaemonSpec(
            name=imex_name(im.domain_uid, self.node),
            role="imex",
            serves=((CLAIM, uid), (DOMAIN, im.domain_uid)),
            command=self.host.imex_daemon(Path(im.config_dir) / "config.cfg"),
            dirs=(im.config_dir,),
            host_network=True,
        )
        with _as_imex():
            pod = self.daemons.start(spec)
        im = dataclasses.replace(im, daemon=pod)
        log.info(
            said,
            claim=ref,
            claim_uid=uid,
            domain=f"{im.namespace}/{im.domain}",
            channel=im.channel,
            address=im.address,
            peers=",".join(im.peers),
            pod=pod.name,
            pod_uid=pod.uid,
        )
        return im

    def _stop(self, pod: DaemonRef) -> None:
        with _as_imex():
            self.daemons.stop(pod)

    def ensure(self, rec: ClaimRecord, save: Callable[[ClaimRecord], None]) -> ClaimRecord:
        """A prepared claim whose daemon's pod is gone (deleted by hand; the Node was
        deleted and made again): started again from its config, at startup and on the
        kubelet's repeated prepare. Not waited for: IMEX is ready at once after starting
        (the guide), and this may run under the node lock. The record after."""
        for i, d in enumerate(rec.devices):
            if (im := d.imex) is None or im.config_dir is None:
                continue
            if im.daemon is not None and self.daemons.serving(im.daemon):
                continue
            if not (Path(im.config_dir) / "config.cfg").exists():
                continue  # interrupted before its config: the startup reconcile undoes it
            started = self._start(rec.uid, rec.ref, im, said="IMEX daemon started again")
            rec = _with_imex(rec, i, started)
            save(rec)
        return rec

    def undo(self, rec: ClaimRecord) -> None:
        """Stops the claim's daemons and removes their files (idempotent). A daemon a
        crash kept out of the record is found by its name (one per domain and node)."""
        for d in rec.devices:
            if (im := d.imex) is None or im.config_dir is None:
                continue
            pod = im.daemon or DaemonRef(imex_name(im.domain_uid, self.node))
            self._stop(pod)
            log.info("IMEX daemon stopped", claim=rec.ref, claim_uid=rec.uid, pod=pod.name)
            shutil.rmtree(im.config_dir, ignore_errors=True)
            self.ledger.imex_stopped(im.domain_uid)

    def configs(self) -> dict[str, list[Path]]:
        """claim uid -> the config directories of its daemons, for every one the ledger
        holds (also those of a claim whose record a lost checkpoint took with it)."""
        out: dict[str, list[Path]] = {}
        for domain_uid, claim in sorted(self.ledger.load().imex.items()):
            out.setdefault(claim, []).append(self.state_dir / "imex" / domain_uid)
        return out

    def undo_forgotten(self, uid: str) -> None:
        """Stops and removes the daemons of a claim the checkpoint does not know: its pods
        by their claim label, its config directories by the ledger."""
        with _as_imex("IMEX daemons"):
            pods = [p for p, _ in self.daemons.find("imex", **{CLAIM: uid})]
        dirs = self.configs().get(uid, [])  # what a lost checkpoint left of the claim
        pods += [DaemonRef(imex_name(d.name, self.node)) for d in dirs]
        for pod in dict.fromkeys(pods):
            self._stop(pod)
            log.info(
                "IMEX daemon of a claim the checkpoint had lost stopped",
                claim_uid=uid,
                pod=pod.name,
            )
        for cfg_dir in dirs:
            shutil.rmtree(cfg_dir, ignore_errors=True)
            self.ledger.imex_stopped(cfg_dir.name)
