"""NCCL's own debug lines (``NCCL_DEBUG=INFO``, subsystems ``INIT,NET``) → which network path it took.

Pure functions, no I/O. The ``nccl`` probe captures the relevant lines of every rank's
``NCCL_DEBUG_FILE`` into ``params["nccl_debug"]`` (``probes.nccl.select_debug_lines``);
:func:`expand_nccl_transport` parses them into ``params["nccl_transport"]`` and, when the run
names the networks it expected (``--expect-transport``, from ``expected_transport`` in the
config) and NCCL used another one, turns a ``pass`` into ``degraded`` with the reason
``nccl_transport: expected IB, used Socket``.

What the lines say, per process (``host:pid``) and per communicator:

- the network NCCL chose (``Using network IB`` / ``IBext_v8`` / ``AWS Libfabric`` / ``Libfabric``
  / ``Socket``), canonicalised by :func:`canonical_transport` into ``IB``, ``OFI``, ``Socket``,
  ``UCX`` (anything else is kept as NCCL wrote it);
- the NICs: ``NET/IB : Using [0]mlx5_0:1/IB ...; OOB ...``, ``NET/Socket : Using [0]eth0:...``,
  ``NET/OFI Selected Provider is efa`` and its ``NIC group`` lines; ``NET/IB : No device found.``;
- what happened to the network plugin (``NET/Plugin ...`` lines: not found, loaded, failed);
- the channels' transports, ``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`` (network,
  NIC index) and intra-node ``via P2P/CUMEM``, ``P2P/IPC``, ``P2P/direct pointer``,
  ``SHM/direct/direct``; NVLS when NCCL set up NVLink SHARP channels. INIT/NET lines do not say
  whether a P2P path is NVLink or PCIe.

Lines are attributed to communicators by thread: ``Using network`` precedes its communicator's
``Init START`` in the same thread; channel lines belong to the last communicator started in their
thread (NCCL connects lazily from the thread that runs the first collective), else the last one
started in the process, else to the next one a line of their thread names (a log cut before
``Init START``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healthd.errors import ParseError
from healthd.parsers.common import MAX_LINE_CHARS
from probes.result import Outcome, ProbeResult

__all__ = [
    "Communicator",
    "ProcessDebug",
    "TransportSummary",
    "canonical_transport",
    "expand_nccl_transport",
    "ib_ports_used",
    "parse_nccl_debug",
    "summarize",
]

PROBE = "nccl"
DEBUG_KEY = "nccl_debug"
"""``params`` key of the probe's captured lines (``probes.nccl.debug_params``)."""
RESULT_KEY = "nccl_transport"
EXPECT_KEY = "expect_transport"
REASON_PREFIX = "nccl_transport"
MAX_WARNINGS = 10

_LINE = re.compile(
    r"(?<![^\s:])(?P<host>[^\s:]*)\s?:(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:\S+ )?"
    r"NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_VERSION = re.compile(r"\bNCCL version (?P<version>\S+)")
_USING_NETWORK = re.compile(r"^Using network (?P<name>\S.*?)\s*$")
_NET_IB_USING = re.compile(r"^NET/IB ?: ?Using (?P<devs>.*?)(?:\s*;\s*OOB (?P<oob>\S+))?\s*$")
_NET_IB_NONE = re.compile(r"^NET/IB ?: ?No device found")
_NET_SOCKET_USING = re.compile(r"^NET/Socket ?: ?Using (?P<devs>.*?)\s*$")
_DEVICE = re.compile(r"\[(?P<index>\d+)\](?P<name>\S+)")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (?P<provider>[^\s,(]+)")
_OFI_NIC = re.compile(r"^NET/OFI NIC group (?P<group>\d+) device #(?P<device>\d+) (?P<pci>\S+)")
_PLUGIN = re.compile(r"^(?:NET/Plugin\b.*|Plugin Path : .*|P2P plugin .*)$")
_COMM_EVENT = re.compile(
    r"^(?:(?P<func>\w+) )?comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)\b"
    r".*- Init (?P<what>START|COMPLETE)\s*$"
)
_COMM_ID = re.compile(r"\bcommId (?P<id>0x[0-9a-fA-F]+)")
_COMM_TOPO = re.compile(
    r"^comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)\b"
)
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) \d+(?:/\d+)? : (?P<src>\d+)(?:\[[^\]]*\])? -> (?P<dst>\d+)(?:\[[^\]]*\])?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*?)\s*$"
)
_NET_VIA = re.compile(r"^NET/(?P<name>.+?)/(?P<nic>\d+)(?:\(\d+\))?(?:/(?P<rest>.*))?$")
_NVLS = re.compile(r"\b(?P<n>\d+) nvls channels\b|\bConnected NVLS\b")


def canonical_transport(name: str) -> str:
    """The family of an NCCL network name: ``IB`` (``IB``, ``IBext``, ``IBext_v8``: verbs, RoCE
    included), ``OFI`` (aws-ofi-nccl: ``AWS Libfabric``, ``Libfabric``, ``OFI``; EFA, Slingshot),
    ``Socket``, ``UCX``; any other name as given. Case-insensitive."""
    text = name.strip()
    low = text.lower()
    if low.startswith("ib"):
        return "IB"
    if "libfabric" in low or low.startswith("ofi"):
        return "OFI"
    if low.startswith("socket"):
        return "Socket"
    if low.startswith("ucx"):
        return "UCX"
    return text


@dataclass(frozen=True)
class Communicator:
    """One communicator as one process saw it."""

    pointer: str | None
    comm_id: str | None
    rank: int | None
    nranks: int | None
    nnodes: int | None
    network: str | None
    """The network NCCL chose for it, as NCCL named it."""
    intra: tuple[str, ...] = ()
    """Distinct intra-node channel transports (``P2P/CUMEM``, ``SHM/direct/direct``...)."""
    inter: tuple[str, ...] = ()
    """Distinct network channel transports (``NET/IB/0/GDRDMA``...)."""
    channel_networks: tuple[str, ...] = ()
    """The network names of its ``via NET/<name>/<nic>`` channels."""
    nics: tuple[int, ...] = ()
    """NIC indices its network channels used."""
    nvls: bool = False


@dataclass(frozen=True)
class ProcessDebug:
    """What one process's NCCL debug lines say."""

    host: str
    pid: int
    version: str | None
    networks: tuple[str, ...]
    """Every ``Using network`` name, first seen first."""
    ib_devices: tuple[str, ...] = ()
    ib_oob: str | None = None
    ib_absent: bool = False
    socket_devices: tuple[str, ...] = ()
    ofi_provider: str | None = None
    ofi_nics: tuple[str, ...] = ()
    plugin: tuple[str, ...] = ()
    """``NET/Plugin`` / ``Plugin Path`` / ``P2P plugin`` messages."""
    warnings: tuple[str, ...] = ()
    communicators: tuple[Communicator, ...] = ()

    @property
    def transports(self) -> frozenset[str]:
        """Canonical networks used: chosen (``Using network``) or carrying channels."""
        names = set(self.networks)
        for comm in self.communicators:
            names.update(comm.channel_networks)
        return frozenset(canonical_transport(n) for n in names)


@dataclass
class _Comm:
    pointer: str | None
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    network: str | None = None
    intra: dict[str, None] = field(default_factory=dict)
    inter: dict[str, None] = field(default_factory=dict)
    channel_networks: dict[str, None] = field(default_factory=dict)
    nics: dict[int, None] = field(default_factory=dict)
    nvls: bool = False

    def freeze(self) -> Communicator:
        return Communicator(
            pointer=self.pointer, comm_id=self.comm_id, rank=self.rank, nranks=self.nranks, nnodes=self.nnodes,
            network=self.network, intra=tuple(self.intra), inter=tuple(self.inter),
            channel_networks=tuple(self.channel_networks), nics=tuple(self.nics), nvls=self.nvls,
        )


@dataclass
class _Process:
    host: str
    pid: int
    version: str | None = None
    networks: dict[str, None] = field(default_factory=dict)
    ib_devices: dict[str, None] = field(default_factory=dict)
    ib_oob: str | None = None
    ib_absent: bool = False
    socket_devices: dict[str, None] = field(default_factory=dict)
    ofi_provider: str | None = None
    ofi_nics: dict[str, None] = field(default_factory=dict)
    plugin: dict[str, None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    comms: dict[str, _Comm] = field(default_factory=dict)
    pending_network: dict[int, str] = field(default_factory=dict)
    pending_channels: dict[int, _Comm] = field(default_factory=dict)
    """Channel lines of a thread before any communicator of that thread was named."""
    current: dict[int, str] = field(default_factory=dict)
    last: str | None = None

    def comm(self, pointer: str, tid: int) -> _Comm:
        comm = self.comms.setdefault(pointer, _Comm(pointer=pointer))
        network = self.pending_network.pop(tid, None)
        if network is not None and comm.network is None:
            comm.network = network
        early = self.pending_channels.pop(tid, None)
        if early is not None:
            comm.intra.update(early.intra)
            comm.inter.update(early.inter)
            comm.channel_networks.update(early.channel_networks)
            comm.nics.update(early.nics)
            comm.nvls = comm.nvls or early.nvls
        return comm

    def channel_comm(self, tid: int) -> _Comm:
        pointer = self.current.get(tid, self.last)
        if pointer is not None:
            return self.comms[pointer]
        return self.pending_channels.setdefault(tid, _Comm(pointer=None))

    def freeze(self) -> ProcessDebug:
        for tid, early in self.pending_channels.items():
            early.network = early.network or self.pending_network.get(tid)
        comms = [c.freeze() for c in self.comms.values()]
        comms += [c.freeze() for c in self.pending_channels.values()]
        return ProcessDebug(
            host=self.host, pid=self.pid, version=self.version, networks=tuple(self.networks),
            ib_devices=tuple(self.ib_devices), ib_oob=self.ib_oob, ib_absent=self.ib_absent,
            socket_devices=tuple(self.socket_devices), ofi_provider=self.ofi_provider,
            ofi_nics=tuple(self.ofi_nics), plugin=tuple(self.plugin), warnings=tuple(self.warnings),
            communicators=tuple(comms),
        )


def _devices(text: str) -> list[str]:
    return [m.group("name") for m in _DEVICE.finditer(text)]


def _apply(proc: _Process, tid: int, level: str, msg: str) -> None:
    if level == "WARN":
        if len(proc.warnings) < MAX_WARNINGS:
            proc.warnings.append(msg.strip())
        return
    if m := _USING_NETWORK.match(msg):
        proc.networks.setdefault(m.group("name"), None)
        proc.pending_network[tid] = m.group("name")
    elif m := _NET_IB_USING.match(msg):
        for name in _devices(m.group("devs")):
            proc.ib_devices.setdefault(name, None)
        proc.ib_oob = m.group("oob") or proc.ib_oob
    elif _NET_IB_NONE.match(msg):
        proc.ib_absent = True
    elif m := _NET_SOCKET_USING.match(msg):
        for name in _devices(m.group("devs")):
            proc.socket_devices.setdefault(name, None)
    elif m := _OFI_PROVIDER.match(msg):
        proc.ofi_provider = m.group("provider")
    elif m := _OFI_NIC.match(msg):
        proc.ofi_nics.setdefault(m.group("pci"), None)
    elif _PLUGIN.match(msg):
        proc.plugin.setdefault(msg.strip(), None)
    elif m := _COMM_EVENT.match(msg):
        comm = proc.comm(m.group("ptr"), tid)
        comm.rank, comm.nranks = int(m.group("rank")), int(m.group("nranks"))
        if cid := _COMM_ID.search(msg):
            comm.comm_id = cid.group("id")
        if m.group("what") == "START":
            proc.current[tid] = proc.last = m.group("ptr")
        elif proc.last is None:
            proc.last = m.group("ptr")
    elif m := _COMM_TOPO.match(msg):
        comm = proc.comm(m.group("ptr"), tid)
        comm.rank, comm.nranks, comm.nnodes = int(m.group("rank")), int(m.group("nranks")), int(m.group("nnodes"))
        if proc.current.get(tid) is None:
            proc.current[tid] = m.group("ptr")
        proc.last = proc.last or m.group("ptr")
    elif m := _CHANNEL.match(msg):
        comm = proc.channel_comm(tid)
        via = m.group("via")
        if net := _NET_VIA.match(via):
            comm.inter.setdefault(f"NET/{net.group('name')}/{net.group('rest') or ''}".rstrip("/"), None)
            comm.channel_networks.setdefault(net.group("name"), None)
            comm.nics.setdefault(int(net.group("nic")), None)
        else:
            comm.intra.setdefault(via, None)
    elif _NVLS.search(msg):
        n = _NVLS.search(msg)
        if n is not None and (n.group("n") is None or int(n.group("n")) > 0):
            proc.channel_comm(tid).nvls = True


def parse_nccl_debug(lines: str | Iterable[str]) -> list[ProcessDebug]:
    """Every process's record in NCCL debug output (one rank's file, or a log mixing many).

    Lines are ``host:pid:tid [dev] NCCL INFO message`` (anything before ``host`` is ignored, e.g.
    an mpirun ``[1,3]<stdout>:`` tag; a source location may stand before ``NCCL WARN``); a bare
    ``NCCL version X`` line belongs to the process of the line before it (or after it, when it
    comes first). Other lines are ignored.

    :raises ParseError: the text holds no NCCL debug line at all.
    """
    rows = lines.splitlines() if isinstance(lines, str) else list(lines)
    procs: dict[tuple[str, int], _Process] = {}
    pending_version: str | None = None
    previous: _Process | None = None
    for raw in rows:
        line = raw.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            continue
        m = _LINE.search(line)
        if m is None:
            if v := _VERSION.search(line):
                if previous is not None:
                    previous.version = previous.version or v.group("version")
                else:
                    pending_version = v.group("version")
            continue
        host, pid = m.group("host").strip(), int(m.group("pid"))
        proc = procs.setdefault((host, pid), _Process(host=host, pid=pid))
        if pending_version is not None:
            proc.version, pending_version = pending_version, None
        previous = proc
        _apply(proc, int(m.group("tid")), m.group("level"), m.group("msg"))
    if not procs:
        first = next((r.strip() for r in rows if r.strip()), "")
        raise ParseError(
            "no NCCL debug line: expected lines like 'host:pid:tid [dev] NCCL INFO ...'"
            + (f"; line 1 is {first[:120]!r}" if first else "; the text is empty")
        )
    return [p.freeze() for p in procs.values()]


# --------------------------------------------------------------------------- summary and verdict


@dataclass(frozen=True)
class RankDebug:
    """One probe rank's parsed lines."""

    rank: int | None
    node: str | None
    processes: tuple[ProcessDebug, ...]


@dataclass(frozen=True)
class TransportSummary:
    used: tuple[str, ...]
    """Canonical networks used by any rank, sorted."""
    networks: tuple[str, ...]
    """The same as NCCL named them."""
    by_node: Mapping[str, frozenset[str]]
    """Canonical networks per node (``?`` for ranks without a node)."""
    communicators: tuple[dict[str, Any], ...]
    nodes: Mapping[str, dict[str, Any]]
    warnings: tuple[str, ...]


def _merge_into(target: dict[str, Any], key: str, values: Iterable[Any]) -> None:
    items: list[Any] = target.setdefault(key, [])
    for v in values:
        if v not in items:
            items.append(v)


def summarize(ranks: Sequence[RankDebug]) -> TransportSummary:
    """Communicators merged across ranks (by ``commId``; without one, per process), the NICs,
    plugin messages and NCCL version per node, and the networks used."""
    comms: dict[str, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    by_node: dict[str, set[str]] = {}
    networks: dict[str, None] = {}
    warnings: list[str] = []
    for rd in ranks:
        node = rd.node or "?"
        info = nodes.setdefault(node, {"nics": [], "ib_absent": False, "ofi_provider": None, "plugin": [],
                                       "version": None})
        for p in rd.processes:
            by_node.setdefault(node, set()).update(p.transports)
            for name in p.networks:
                networks.setdefault(name, None)
            _merge_into(info, "nics", [*p.ib_devices, *p.socket_devices, *p.ofi_nics])
            _merge_into(info, "plugin", p.plugin)
            info["ib_absent"] = info["ib_absent"] or p.ib_absent
            info["ofi_provider"] = info["ofi_provider"] or p.ofi_provider
            info["version"] = info["version"] or p.version
            warnings.extend(w for w in p.warnings if w not in warnings)
            for c in p.communicators:
                for name in c.channel_networks:
                    networks.setdefault(name, None)
                key = c.comm_id or f"{p.host}:{p.pid}:{c.pointer or '-'}"
                entry = comms.setdefault(key, {"comm_id": c.comm_id, "nranks": c.nranks, "nnodes": c.nnodes,
                                               "networks": [], "intra": [], "inter": [], "nvls": False,
                                               "ranks": []})
                entry["nnodes"] = entry["nnodes"] if entry["nnodes"] is not None else c.nnodes
                entry["nranks"] = entry["nranks"] if entry["nranks"] is not None else c.nranks
                _merge_into(entry, "networks", [n for n in (c.network, *c.channel_networks) if n])
                _merge_into(entry, "intra", c.intra)
                _merge_into(entry, "inter", c.inter)
                entry["nvls"] = entry["nvls"] or c.nvls
                if rd.rank is not None:
                    _merge_into(entry, "ranks", [rd.rank])
    for entry in comms.values():
        entry["transports"] = sorted({canonical_transport(n) for n in entry["networks"]})
    used = sorted({t for ts in by_node.values() for t in ts})
    return TransportSummary(
        used=tuple(used), networks=tuple(networks), by_node={k: frozenset(v) for k, v in by_node.items()},
        communicators=tuple(comms.values()), nodes=nodes, warnings=tuple(warnings[:MAX_WARNINGS]),
    )


def mismatch_reason(summary: TransportSummary, expected: Sequence[str]) -> str | None:
    """``nccl_transport: expected IB or OFI, used Socket`` (naming the nodes when not all of them
    are concerned), or ``None`` when every network used is expected or nothing is expected."""
    if not expected:
        return None
    allowed = {canonical_transport(e) for e in expected}
    bad = sorted(set(summary.used) - allowed)
    if not bad:
        return None
    text = f"{REASON_PREFIX}: expected {' or '.join(dict.fromkeys(canonical_transport(e) for e in expected))}, " \
           f"used {', '.join(bad)}"
    where = sorted(n for n, ts in summary.by_node.items() if ts - allowed)
    if where and len(where) < len(summary.by_node):
        text += f" (on {', '.join(where)})"
    return text


def _rank_entries(debug: Mapping[str, Any]) -> tuple[list[RankDebug], list[str], list[int]]:
    ranks: list[RankDebug] = []
    problems: list[str] = []
    truncated: list[int] = []
    entries = debug.get("ranks")
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, Mapping):
            problems.append(f"ranks[{i}] is not an object")
            continue
        rank = entry.get("rank") if isinstance(entry.get("rank"), int) else None
        node = entry.get("node") if isinstance(entry.get("node"), str) else None
        label = f"rank {rank if rank is not None else i}"
        lines = entry.get("lines")
        if entry.get("truncated") is True and rank is not None:
            truncated.append(rank)
        if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            problems.append(f"{label}: {entry.get('error') or 'no lines captured'}")
            continue
        try:
            ranks.append(RankDebug(rank, node, tuple(parse_nccl_debug(lines))))
        except ParseError as exc:
            problems.append(f"{label}: {exc}")
    return ranks, problems, truncated


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def expand_nccl_transport(result: ProbeResult) -> ProbeResult:
    """The ``nccl`` probe's captured NCCL debug lines → ``params["nccl_transport"]``, and
    ``degraded`` when a network outside ``params["expect_transport"]`` was used.

    ``status`` is ``ok`` (parsed), ``gloo`` (no NCCL: nothing to expect) or ``unknown`` (nothing
    captured or readable: ``why`` says what; never changes the outcome). Only a ``pass`` becomes
    ``degraded`` (a ``fail`` or ``error`` says more); the result is copied with
    ``model_copy`` because ``ProbeResult``'s validator refuses ``degraded`` from probes.
    Any other probe's result is returned unchanged.
    """
    if result.probe != PROBE:
        return result
    expected = _strings(result.params.get(EXPECT_KEY))
    debug = result.params.get(DEBUG_KEY)
    record: dict[str, Any] = {"expected": expected}
    if not isinstance(debug, Mapping):
        record.update(status="unknown", why="the probe captured no NCCL debug output (an older probe?)")
    elif debug.get("status") == "gloo":
        record.update(status="gloo", used=["gloo"], why="gloo backend: NCCL was not used, no expectation applies")
    else:
        ranks, problems, truncated = _rank_entries(debug)
        summary = summarize(ranks) if ranks else None
        if summary is None or not summary.used:
            why = "; ".join(problems) or "the NCCL debug lines name no network"
            if isinstance(debug.get("NCCL_DEBUG"), str) and debug.get("NCCL_DEBUG") not in ("INFO", "TRACE"):
                why = f"NCCL_DEBUG={debug.get('NCCL_DEBUG')}: {why}"
            record.update(status="unknown", why=why)
        else:
            record.update(
                status="ok", used=list(summary.used), networks=list(summary.networks),
                communicators=list(summary.communicators), nodes=dict(summary.nodes),
                warnings=list(summary.warnings),
            )
            if problems:
                record["problems"] = problems
            if truncated:
                record["truncated_ranks"] = truncated
            reason = mismatch_reason(summary, expected)
            if reason is not None:
                record["mismatch"] = reason
                if result.outcome is Outcome.PASS:
                    return result.model_copy(update={
                        "outcome": Outcome.DEGRADED,
                        "reason": reason if not result.reason else f"{result.reason}; {reason}",
                        "params": {**result.params, RESULT_KEY: record},
                    })
    return result.model_copy(update={"params": {**result.params, RESULT_KEY: record}})


_IB_NIC = re.compile(r"^(?P<devs>[^:/\s]+):(?P<port>\d+)(?:/|$)")


def ib_ports_used(params: Mapping[str, Any]) -> dict[str, frozenset[tuple[str, str]]]:
    """Node → the InfiniBand ports NCCL used there, from ``params["nccl_transport"]["nodes"][node]["nics"]`` (the
    ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/RoCE`` devices: ``("mlx5_0", "1")``; merged devices,
    ``mlx5_0+mlx5_1:1``, give each). Nodes without IB NICs (a Socket or OFI run) are absent: not known."""
    doc = params.get(RESULT_KEY)
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    out: dict[str, frozenset[tuple[str, str]]] = {}
    if not isinstance(nodes, Mapping):
        return out
    for node, info in nodes.items():
        nics = info.get("nics") if isinstance(info, Mapping) else None
        ports = {(dev, m.group("port")) for nic in (nics if isinstance(nics, list) else [])
                 if isinstance(nic, str) and (m := _IB_NIC.match(nic)) for dev in m.group("devs").split("+")}
        if ports and isinstance(node, str):
            out[node] = frozenset(ports)
    return out
