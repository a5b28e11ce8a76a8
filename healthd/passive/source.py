"""The passive source: one poll of the site's Prometheus, every signal's query, to a ``PassivePoll``.

``PassiveSource.poll`` asks one instant query per signal (never one per node), reads each answer
(``healthd.parsers.prometheus_query``), places its series on known nodes and GPUs
(``healthd.passive.names``) and lets the ``SignalTracker`` (``healthd.passive.signals``) say what fired. It
never raises for Prometheus, network or garbage problems: a failed query is an error line of its signal
(its state unknown, not healthy); every query failing is ``up=False``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Protocol

from healthd.config import PassiveSettings
from healthd.logging import get_logger
from healthd.parsers.prometheus_query import QueryAnswerError, parse_query_response
from healthd.passive.activity import busy
from healthd.passive.client import PassiveQueryError, PrometheusClient
from healthd.passive.fabric import FabricAnswers, FabricPoll, FabricTracker
from healthd.passive.model import SIGNALS, PassivePoll, PassiveSignal, SignalName
from healthd.passive.names import Located, NodeNamer, locate
from healthd.passive.pcie import links
from healthd.passive.signals import SignalTracker, XidPolicy

log = get_logger(__name__)


class QueryClient(Protocol):
    def query(self, promql: str) -> bytes: ...


def xid_policy(settings: PassiveSettings) -> XidPolicy:
    x = settings.xid
    return XidPolicy(frozenset(x.fault), frozenset(x.application), frozenset(x.contained))


def error_signals(poll: PassivePoll) -> Counter[str]:
    """The errors of a poll per signal (each error line starts with its signal's name)."""
    return Counter(line.split(":", 1)[0] for line in poll.errors)


class PassiveSource:
    """Polls the site's Prometheus; keeps the previous values between polls (events fire once)."""

    def __init__(self, settings: PassiveSettings, *, client: QueryClient | None = None) -> None:
        self.settings = settings
        self.client: QueryClient = client or PrometheusClient(settings)
        self.namer = NodeNamer.of(settings.host_labels, settings.node_regex, settings.node_replacement)
        self.tracker = SignalTracker(xid_policy(settings))
        self.fabric = FabricTracker()
        self._known: frozenset[str] = frozenset()

    def query_of(self, signal: SignalName) -> str:
        query: str = getattr(self.settings.queries, signal)
        return query

    def poll(self, nodes: Collection[str], now: float) -> PassivePoll:
        known = frozenset(nodes)
        if gone := self._known - known:
            self.tracker.forget(gone)
            self.fabric.forget(gone)
        self._known = known
        signals: list[PassiveSignal] = []
        covered: set[str] = set()
        unavailable: list[SignalName] = []
        failed: list[SignalName] = []
        errors: list[str] = []
        unknown = 0
        for signal in SIGNALS:
            try:
                answer = parse_query_response(self.client.query(self.query_of(signal)),
                                              max_series=self.settings.max_series)
            except (PassiveQueryError, QueryAnswerError) as exc:
                failed.append(signal)
                errors.append(f"{signal}: {exc}")
                continue
            except Exception as exc:  # whatever the answer did to us: this signal's error, not the daemon's
                log.exception("passive_query_crashed", signal=signal)
                failed.append(signal)
                errors.append(f"{signal}: {type(exc).__name__}: {exc}"[:500])
                continue
            if not answer.samples and not answer.bad_values:
                unavailable.append(signal)
                continue
            located, strangers = locate([(s.labels, s.value) for s in answer.samples], self.namer, known)
            unknown += strangers
            covered.update(s.node for s in located)
            observed = self.tracker.observe(signal, located, now)
            signals.extend(observed.signals)
            bad = answer.bad_values + observed.bad_values
            if bad:
                first = f" (first: {answer.first_bad!r})" if answer.first_bad else ""
                errors.append(f"{signal}: {bad} series with a value that is not a valid number{first}")
        fabric = self._fabric(known, now, errors) if self.settings.fabric.enabled else None
        active = self._activity(known, errors) if self.settings.activity.enabled else None
        pcie = self._query("pcie", self.settings.pcie.query, known, errors) if self.settings.pcie.enabled else None
        return PassivePoll(at=now, up=len(failed) < len(SIGNALS), signals=tuple(signals),
                           covered=frozenset(covered), unavailable=tuple(unavailable), errors=tuple(errors),
                           unknown_series=unknown, failed=tuple(failed), busy=active,
                           pcie=links(pcie) if pcie is not None else None, fabric=fabric)

    def _query(self, name: str, promql: str, known: frozenset[str], errors: list[str]) -> list[Located] | None:
        """One query's series on known nodes; ``None`` (and an error line ``<name>: ...``) when it failed."""
        try:
            answer = parse_query_response(self.client.query(promql), max_series=self.settings.max_series)
        except (PassiveQueryError, QueryAnswerError) as exc:
            errors.append(f"{name}: {exc}")
            return None
        except Exception as exc:
            log.exception("passive_query_crashed", signal=name)
            errors.append(f"{name}: {type(exc).__name__}: {exc}"[:500])
            return None
        located, _ = locate([(s.labels, s.value) for s in answer.samples], self.namer, known)
        return located

    def _activity(self, known: frozenset[str], errors: list[str]) -> dict[tuple[str, str], tuple[bool, str]] | None:
        located = self._query("activity", self.settings.activity.query, known, errors)
        return busy(located) if located is not None else None

    def _fabric(self, known: frozenset[str], now: float, errors: list[str]) -> FabricPoll:
        """The fabric queries (``[passive.fabric]``), each one query for the whole fleet; a failed one is an
        error line (``ib_<part>: ...``) and its part unknown this poll."""
        q = self.settings.fabric
        parts = {part: self._query(f"ib_{part}", promql, known, errors)
                 for part, promql in (("counters", q.counters), ("present", q.present), ("links", q.links),
                                      ("physical", q.physical), ("boot", q.boot))}
        return self.fabric.observe(FabricAnswers(parts["counters"], parts["present"], parts["links"],
                                                 parts["physical"], parts["boot"]), now)
