"""Rank liveness over the rendezvous TCPStore, and naming the rank at fault.

Every rank keeps a few keys in the job's TCPStore (under a prefix):

- ``hb/<rank>``: a counter the rank's heartbeat thread increments every
  :data:`HEARTBEAT_S`; a counter that stops moving means the process is gone (or frozen);
- ``prog/<rank>``: ``"<seq>|<phase>"``, set at every phase boundary of the probe (each
  collective/size/placement, each GEMM dtype...), so a rank left behind is visible;
- ``err/<rank>``: the text of the error that ended the rank, ``nerr`` counts them;
- ``done/<rank>``: the rank finished normally; ``term/<rank>``: it was told to stop (SIGTERM).

Rank 0's heartbeat thread also watches the other ranks and ends the probe early when one has
died or reported an error that rank 0's main thread has not surfaced itself. When the probe
fails, :func:`diagnose` turns the observed states into a reason that names the rank(s) at
fault. Comparing counters (not clocks) keeps this free of clock skew between nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

HEARTBEAT_S = 0.4
DEAD_AFTER_S = 10.0
"""A rank whose heartbeat has not moved for this long (and that did not finish) is dead."""
ERROR_GRACE_S = 4.0
"""How long rank 0's main thread may take to surface another rank's reported error itself."""
OBSERVE_S = 1.2
"""Observation window for a one-off diagnosis (three heartbeats)."""


@dataclass(frozen=True)
class RankState:
    rank: int
    node: str | None = None
    seq: int | None = None
    phase: str | None = None
    alive: bool | None = None
    """Heartbeat moved during the observation; ``None``: never seen (the rank never joined)."""
    error: str | None = None
    done: bool = False
    terminated: bool = False


@dataclass(frozen=True)
class Diagnosis:
    culprits: tuple[int, ...]
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "; ".join(self.lines)


def _who(s: RankState) -> str:
    return f"rank {s.rank}" + (f" (node {s.node})" if s.node else "")


def _phase(s: RankState) -> str:
    return f"'{s.phase}'" if s.phase else "start-up"


def diagnose(states: Sequence[RankState]) -> Diagnosis:
    """Name the ranks at fault, most likely first.

    Order: ranks that died without a word, ranks that never joined, ranks left behind in an
    earlier phase than the others (stuck, with their error if they reported one; also when the
    launcher terminated them afterwards), then the other ranks' errors, typically timeouts of
    ranks that waited on a culprit.
    """
    culprits: list[int] = []
    lines: list[str] = []
    active = [s for s in states if not s.done and not s.terminated]
    for s in active:
        if s.alive is False and s.error is None:
            culprits.append(s.rank)
            lines.append(f"{_who(s)} died without reporting an error, in phase {_phase(s)}")
    for s in active:
        if s.alive is None and s.error is None:
            culprits.append(s.rank)
            lines.append(f"{_who(s)} never joined (no heartbeat)")
    seqs = [s.seq for s in active if s.seq is not None]
    if seqs:
        top = max(seqs)
        leader = next(s for s in active if s.seq == top)
        laggards = sorted(
            (s for s in states if not s.done and s.rank not in culprits and s.seq is not None and s.seq < top),
            key=lambda s: (s.seq or 0, s.rank),
        )
        for s in laggards:
            culprits.append(s.rank)
            lines.append(
                f"{_who(s)} was stuck in phase {_phase(s)} while rank {leader.rank} reached {_phase(leader)}"
                + (f" ({s.error})" if s.error else "")
                + (" (then terminated by its launcher)" if s.terminated else "")
            )
        if not culprits and len(active) > 1 and len(seqs) == len(active) and len(set(seqs)) == 1:
            lines.append(f"all {len(active)} ranks stuck in phase {_phase(leader)}")
    errored = sorted(
        (s for s in states if s.error is not None and s.rank not in culprits),
        key=lambda s: (s.seq or 0, s.rank),
    )
    for s in errored:
        culprits.append(s.rank)
        lines.append(f"{_who(s)} failed in phase {_phase(s)}: {s.error}")
    for s in states:
        if s.terminated and s.error is None and s.rank not in culprits:
            lines.append(f"{_who(s)} was terminated by its launcher (SIGTERM)")
    return Diagnosis(culprits=tuple(culprits), lines=tuple(lines))


class Liveness:
    """The store keys of one rank; every thread gets its own store client."""

    def __init__(
        self,
        connect: Callable[[float], Any],
        rank: int,
        world_size: int,
    ) -> None:
        self._connect = connect
        self.rank = rank
        self.world_size = world_size
        self._main: Any | None = None
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.nodes: dict[int, str] = {}
        self.store_lost = False
        """The store stopped answering (its host, rank 0 or the agent, is gone)."""

    def attach(self, store: Any) -> None:
        """Use ``store`` (the main thread's client) for progress marks."""
        self._main = store

    def mark(self, phase: str) -> None:
        if self._main is None:
            return
        self._seq += 1
        self._main.set(f"prog/{self.rank}", f"{self._seq}|{phase}")

    def report(self, key: str, value: str, store: Any | None = None) -> None:
        """Write ``<key>/<rank>`` with a fresh client (callable from any thread)."""
        if self.store_lost:
            return
        try:
            client = store or self._connect(1.0)
            client.set(f"{key}/{self.rank}", value)
            if key == "err":
                client.add("nerr", 1)
        except Exception:  # the store may be gone with rank 0; nothing more to do
            pass

    def start(
        self,
        on_peer_failure: Callable[[str], None],
        on_leader_lost: Callable[[], None],
    ) -> None:
        """Start the heartbeat thread. On rank 0 it calls ``on_peer_failure(summary)`` when a
        rank died or reported an error; elsewhere ``on_leader_lost()`` when rank 0 is gone."""
        self._thread = threading.Thread(
            target=self._run, args=(on_peer_failure, on_leader_lost), name="healthd-heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, on_peer_failure: Callable[[str], None], on_leader_lost: Callable[[], None]) -> None:
        try:
            store = self._connect(10.0)
        except Exception:
            return
        watch = _Watch(self.rank, self.world_size)
        failures = 0
        tick = 0
        while True:
            tick += 1
            try:
                store.add(f"hb/{self.rank}", 1)
                failures = 0
                problem = watch.look(store) if tick % 2 == 0 else None
            except Exception:
                failures += 1
                problem = None
                if failures >= 2 and self.rank != 0:
                    self.store_lost = True
                    problem = "store lost"
            if problem is not None:
                if self.rank == 0:
                    on_peer_failure(problem)
                else:
                    on_leader_lost()
                return
            if self._stop.wait(HEARTBEAT_S):
                return

    def observe(self, nodes: dict[int, str] | None = None, window_s: float = OBSERVE_S) -> list[RankState]:
        """Read every rank's keys twice, ``window_s`` apart, and return their states."""
        store = self._connect(5.0)
        ranks = range(self.world_size)

        def beats() -> dict[int, int | None]:
            out: dict[int, int | None] = {}
            for r in ranks:
                out[r] = int(store.add(f"hb/{r}", 0)) if store.check([f"hb/{r}"]) else None
            return out

        before = beats()
        time.sleep(window_s)
        after = beats()
        states: list[RankState] = []
        node_of = nodes or self.nodes
        for r in ranks:
            seq: int | None = None
            phase: str | None = None
            if store.check([f"prog/{r}"]):
                raw = _text(store.get(f"prog/{r}"))
                seq_s, _, phase = raw.partition("|")
                seq = int(seq_s) if seq_s.isdigit() else None
            error = _text(store.get(f"err/{r}")) if store.check([f"err/{r}"]) else None
            b, a = before[r], after[r]
            alive: bool | None
            if r == self.rank:
                alive = True
            elif not a:
                alive = False if seq is not None else None
            else:
                alive = b is None or a > b
            states.append(
                RankState(
                    rank=r,
                    node=node_of.get(r),
                    seq=seq,
                    phase=phase,
                    alive=alive,
                    error=error,
                    done=store.check([f"done/{r}"]),
                    terminated=store.check([f"term/{r}"]),
                )
            )
        return states


class _Watch:
    """What rank 0 watches (every other rank) and what the others watch (rank 0)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.watched = range(1, world_size) if rank == 0 else range(0, 1)
        self.last_value: dict[int, int] = {}
        self.last_change: dict[int, float] = {}
        self.first_err_at: float | None = None

    def _stalled(self, store: Any, r: int, now: float) -> bool:
        return (
            self.last_value.get(r, 0) > 0
            and now - self.last_change[r] > DEAD_AFTER_S
            and not store.check([f"done/{r}"])
            and not store.check([f"err/{r}"])
        )

    def look(self, store: Any) -> str | None:
        """A reason to stop now, or ``None``."""
        now = time.monotonic()
        for r in self.watched:
            value = int(store.add(f"hb/{r}", 0))
            if value != self.last_value.get(r):
                self.last_value[r] = value
                self.last_change[r] = now
        dead = [r for r in self.watched if self._stalled(store, r, now)]
        if dead:
            return f"heartbeat of rank(s) {dead} stopped"
        if self.rank == 0 and int(store.add("nerr", 0)) > 0:
            self.first_err_at = self.first_err_at or now
            if now - self.first_err_at > ERROR_GRACE_S:
                return "another rank reported an error"
        return None


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)


def tcp_store(host: str, port: int, timeout_s: float, *, is_master: bool = False) -> Any:
    """A TCPStore client (or, with ``is_master``, the server and a client) at ``host:port``."""
    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined]
        host,
        port,
        None,
        is_master,
        timeout=timedelta(seconds=max(1.0, timeout_s)),
        wait_for_workers=False,
    )


def prefixed_client(host: str, port: int, prefix: str) -> Callable[[float], Any]:
    """A factory of fresh store clients under ``prefix``, one per thread that needs one."""
    import torch.distributed as dist

    def connect(timeout_s: float) -> Any:
        return dist.PrefixStore(prefix, tcp_store(host, port, timeout_s))  # type: ignore[attr-defined]

    return connect
