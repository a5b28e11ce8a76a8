"""Results built from other tools' output: merging a file's results, expanding raw probe output.

Pure functions of ``ProbeResult`` documents (no I/O).

``merge_results`` turns the results one output gave (one per nccl-tests binary in a log that
ran several) into one result per node set, so one file is one stored run per node set and
its outcome is the worst of its parts: a log whose all_gather found wrong data is a ``fail``
even when its all_reduce passed.

``expand_nccl_tests_result`` is the daemon-side half of the ``nccl_tests`` probe
(``probes/nccl_tests.py``): the probe runs the binaries and puts their raw output in
``params['raw_outputs']``; this parses it with ``healthd.parsers.nccl_tests`` and returns the
result with measurements, checks and an outcome that takes the parsed output into account.

``expand_result`` is what the daemon applies to every result it reads: the device rules of
``healthd.parsers.devices`` (no CPU run of a GPU node), the above, and the
``nccl`` probe's captured NCCL debug lines turned into its network path and judged against the
expected transport (``healthd.parsers.nccl_transport.expand_nccl_transport``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from healthd.errors import ParseError
from healthd.parsers import nccl_tests
from healthd.parsers.devices import device_rules
from healthd.parsers.nccl_transport import expand_nccl_transport
from probes.result import Check, Measurement, Outcome, ProbeResult

__all__ = [
    "MAX_REASON_CHARS",
    "RAW_OUTPUTS_KEY",
    "expand_nccl_tests_result",
    "expand_result",
    "merge_group",
    "merge_results",
    "worst_outcome",
]

RAW_OUTPUTS_KEY = "raw_outputs"
"""``params`` key of the ``nccl_tests`` probe's captured binary outputs (see ``probes.nccl_tests``)."""
INTERRUPTED_KEY = "interrupted"
"""``params`` key the probe sets when it was stopped (SIGTERM) before every binary ran."""
MAX_REASON_CHARS = 2000
BANDWIDTH_CHECK_EXIT = 7
"""nccl-tests' exit status (``testNumResults``) for wrong data or a failed ``NCCL_TESTS_MIN_BW`` check."""

_SEVERITY = {Outcome.FAIL: 4, Outcome.ERROR: 3, Outcome.DEGRADED: 2, Outcome.PASS: 1, Outcome.SKIPPED: 0}


def worst_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    """``fail`` over ``error`` over ``pass`` over ``skipped`` (``skipped`` only when all are)."""
    if not outcomes:
        return Outcome.ERROR
    return max(outcomes, key=lambda o: _SEVERITY[o])


def _part_label(result: ProbeResult, index: int) -> str:
    for key in ("program", "collective"):
        value = result.params.get(key)
        if isinstance(value, str) and value:
            return value
    return f"part {index + 1}"


def _join_reasons(parts: Sequence[tuple[str, Outcome, str]]) -> str:
    ordered = sorted((p for p in parts if p[2]), key=lambda p: -_SEVERITY[p[1]])
    text = "; ".join(f"{label}: {reason}" for label, _, reason in ordered)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _measurement_key(m: Measurement) -> tuple[str, str | None, tuple[tuple[str, str], ...]]:
    return (m.name, m.node, tuple(sorted(m.labels.items())))


def merge_group(parts: Sequence[ProbeResult], labels: Sequence[str] | None = None) -> ProbeResult:
    """One result from ``parts`` of the same probe and node set.

    Outcome: the worst part's (``worst_outcome``); reason: every part's reason, worst first,
    each prefixed by the part's label (its ``program``/``collective`` param). Measurements
    repeating an earlier part's (same name, node and labels) are dropped and counted in
    ``params['duplicate_measurements_dropped']``; every part's params are kept in
    ``params['parts']``. A single part is returned unchanged.
    """
    if not parts:
        raise ValueError("merge_group needs at least one result")
    if len(parts) == 1:
        return parts[0]
    probes = {p.probe for p in parts}
    if len(probes) != 1:
        raise ValueError(f"cannot merge results of different probes {sorted(probes)}")
    names = list(labels) if labels is not None else [_part_label(p, i) for i, p in enumerate(parts)]
    outcome = worst_outcome([p.outcome for p in parts])
    seen: set[tuple[str, str | None, tuple[tuple[str, str], ...]]] = set()
    measurements: list[Measurement] = []
    dropped = 0
    for part in parts:
        for m in part.measurements:
            key = _measurement_key(m)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            measurements.append(m)
    nodes: dict[str, None] = {}
    for part in parts:
        for node in part.nodes:
            nodes.setdefault(node, None)
    tools = {p.params.get("tool") for p in parts}
    params: dict[str, Any] = {"parts": [dict(p.params) for p in parts], "duplicate_measurements_dropped": dropped}
    if len(tools) == 1 and isinstance(next(iter(tools)), str):
        params["tool"] = next(iter(tools))
    return ProbeResult(
        probe=parts[0].probe,
        run_id=parts[0].run_id,
        outcome=outcome,
        reason=_join_reasons([(name, p.outcome, p.reason) for name, p in zip(names, parts, strict=True)]),
        started_at=min(p.started_at for p in parts),
        finished_at=max(p.finished_at for p in parts),
        nodes=list(nodes),
        environment=parts[0].environment,
        params=params,
        measurements=measurements,
        checks=[c for p in parts for c in p.checks],
    )


def merge_results(results: Sequence[ProbeResult]) -> list[ProbeResult]:
    """``merge_group`` over the results that share a probe and a node list, in first-seen order."""
    groups: dict[tuple[str, tuple[str, ...]], list[ProbeResult]] = {}
    for result in results:
        groups.setdefault((result.probe, tuple(result.nodes)), []).append(result)
    return [merge_group(group) for group in groups.values()]


# --------------------------------------------------------------------------- nccl_tests probe


def _str(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    return value if isinstance(value, str) else ""


def _attributed(result: ProbeResult, node: str | None) -> ProbeResult:
    """``result`` with every measurement and check on ``node`` (``None``: the run's group)."""
    return result.model_copy(
        update={
            "measurements": [m.model_copy(update={"node": node}) for m in result.measurements],
            "checks": [c.model_copy(update={"node": node}) for c in result.checks],
        }
    )


def _rank_mismatch(parsed: Sequence[ProbeResult], tasks: int | None, gpus: int | None) -> str:
    """Why the output's rank count is not the job's (``tasks`` x ``gpus``), or ``""``."""
    if tasks is None or gpus is None:
        return ""
    expected = tasks * gpus
    for part in parsed:
        nranks = part.params.get("nranks")
        if isinstance(nranks, int) and nranks != expected:
            return (f"nccl-tests ran {nranks} ranks, the job {expected} ({_plural(tasks, 'task')} x "
                    f"{_plural(gpus, 'GPU')}); a build without MPI needs one task per node (ranks_per_node = 1)")
    return ""


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _expand_part(
    entry: object, index: int, node: str | None, at: float, tasks: int | None = None, gpus: int | None = None
) -> tuple[str, ProbeResult]:
    """One binary's raw output → (label, result with its measurements and its own outcome)."""
    if not isinstance(entry, Mapping):
        bad = ProbeResult(probe=nccl_tests.PROBE, outcome=Outcome.ERROR, reason="raw output entry is not an object",
                          started_at=at, finished_at=at)
        return f"raw_outputs[{index}]", bad
    collective = _str(entry, "collective")
    hint = collective if collective in nccl_tests.KNOWN_COLLECTIVES else None
    label = _str(entry, "program") or (f"{collective}_perf" if collective else f"raw_outputs[{index}]")
    output = _str(entry, "output")
    error = _str(entry, "error")
    exit_code = entry.get("exit_code")
    summary: dict[str, Any] = {"program": label, "collective": hint, "exit_code": exit_code}

    parsed: list[ProbeResult] = []
    parse_error = ""
    if output.strip():
        try:
            parsed = nccl_tests.to_probe_results(nccl_tests.parse_nccl_tests(output, collective=hint), node=node, at=at)
        except ParseError as exc:
            parse_error = str(exc)
    base = _attributed(merge_group(parsed), node) if parsed else None
    if base is not None:
        summary = {**{k: v for k, v in base.params.items() if k not in ("parts", "program")}, **summary}
        if len(parsed) > 1:
            summary["runs"] = len(parsed)

    outcome, reason = Outcome.PASS, ""
    if base is not None and base.outcome is Outcome.FAIL:
        outcome, reason = Outcome.FAIL, base.reason  # wrong data is evidence whatever the exit status
    elif error:
        outcome, reason = Outcome.ERROR, error
        if base is not None and base.outcome is Outcome.ERROR and base.reason:
            reason += f" ({base.reason})"
    elif isinstance(exit_code, int) and exit_code != 0:
        bandwidth_check = base is not None and any(
            p.params.get("avg_busbw_check") == "FAILED" for p in parsed
        )
        if exit_code == BANDWIDTH_CHECK_EXIT and bandwidth_check and base is not None and base.outcome is Outcome.PASS:
            outcome = Outcome.PASS
            reason = "average bus bandwidth below NCCL_TESTS_MIN_BW (nccl-tests exit status 7)"
        else:
            outcome, reason = Outcome.ERROR, f"exited with status {exit_code}"
            if base is not None and base.reason:
                reason += f": {base.reason}"
            elif parse_error:
                reason += f"; unreadable output: {parse_error}"
    elif not isinstance(exit_code, int):
        outcome, reason = Outcome.ERROR, "no exit status recorded"
    elif parse_error:
        outcome, reason = Outcome.ERROR, f"unreadable output: {parse_error}"
    elif base is None:
        outcome, reason = Outcome.ERROR, "no output"
    else:
        outcome, reason = base.outcome, base.reason
    if outcome is Outcome.PASS and (mismatch := _rank_mismatch(parsed, tasks, gpus)):
        outcome, reason = Outcome.ERROR, mismatch

    part = ProbeResult(
        probe=nccl_tests.PROBE,
        outcome=outcome,
        reason=reason,
        started_at=at,
        finished_at=at,
        params=summary,
        measurements=list(base.measurements) if base is not None else [],
        checks=list(base.checks) if base is not None else [],
    )
    return label, part


def expand_nccl_tests_result(result: ProbeResult) -> ProbeResult:
    """Parse the raw nccl-tests output the ``nccl_tests`` probe captured into measurements.

    Any other result (another probe, or no ``raw_outputs``) is returned unchanged. Node
    attribution is the run's: a one-node run puts every measurement and check on that node
    (the Slurm name, whatever hostname nccl-tests printed); a multi-node run leaves ``node``
    empty so the store counts them for each node of the run.

    Outcome, per binary: ``fail`` when its output shows wrong data (``#wrong`` > 0, out of
    bounds values), whatever its exit status; ``error`` when it could not run, was killed
    or timed out, exited non-zero (except status 7 from a failed ``NCCL_TESTS_MIN_BW`` check,
    which is a ``pass`` left for the judge to weigh), or printed nothing readable; ``error``
    too when its device list shows another rank count than the job's ``params['tasks']`` x
    ``params['gpus']`` (a build without MPI started once per GPU measures one GPU alone, its
    numbers meaningless); else what the parser says. The run's outcome is the worst
    binary's; an ``interrupted`` probe is at least ``error``. ``params['parsed']`` keeps each
    binary's parse summary; the raw outputs stay in ``params``.
    """
    if result.probe != nccl_tests.PROBE or RAW_OUTPUTS_KEY not in result.params:
        return result
    raw = result.params[RAW_OUTPUTS_KEY]
    node = result.nodes[0] if len(result.nodes) == 1 else None
    at = result.finished_at
    entries: list[object] = list(raw) if isinstance(raw, list) else []
    tasks, gpus = _positive_int(result.params.get("tasks")), _positive_int(result.params.get("gpus"))
    labelled = [_expand_part(entry, i, node, at, tasks, gpus) for i, entry in enumerate(entries)]
    reasons: list[tuple[str, Outcome, str]] = [(label, part.outcome, part.reason) for label, part in labelled]
    outcomes = [part.outcome for _, part in labelled]
    interrupted = result.params.get(INTERRUPTED_KEY)
    if not isinstance(raw, list):
        outcomes.append(Outcome.ERROR)
        reasons.append(("nccl_tests", Outcome.ERROR, f"{RAW_OUTPUTS_KEY} is not a list"))
    elif not entries:
        outcomes.append(Outcome.ERROR)
        reasons.append(("nccl_tests", Outcome.ERROR, result.reason or "no nccl-tests binary was run"))
    if isinstance(interrupted, str) and interrupted:
        outcomes.append(Outcome.ERROR)
        reasons.append(("nccl_tests", Outcome.ERROR, interrupted))
    outcome = worst_outcome(outcomes)
    measurements: list[Measurement] = []
    seen: set[tuple[str, str | None, tuple[tuple[str, str], ...]]] = set()
    for _, part in labelled:
        for m in part.measurements:
            key = _measurement_key(m)
            if key not in seen:
                seen.add(key)
                measurements.append(m)
    checks: list[Check] = [*result.checks, *(c for _, part in labelled for c in part.checks)]
    return result.model_copy(
        update={
            "outcome": outcome,
            "reason": _join_reasons(reasons),
            "measurements": [*result.measurements, *measurements],
            "checks": checks,
            "params": {**result.params, "parsed": [part.params for _, part in labelled]},
        }
    )


def expand_result(result: ProbeResult) -> ProbeResult:
    """Everything the daemon derives from a probe's raw captures: ``expand_nccl_tests_result``
    (``nccl_tests`` probe) and ``expand_nccl_transport`` (``nccl`` probe); any other result is
    returned unchanged; first, ``healthd.parsers.devices.device_rules`` (a GPU node's CPU run keeps no
    figure and fails; a one-GPU node's intra-node NCCL is ``skipped``)."""
    return expand_nccl_transport(expand_nccl_tests_result(device_rules(result)))
