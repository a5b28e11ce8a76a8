"""``healthd doctor``: is this admin node's healthd wired up? One ``Check`` per piece, each with what it
found and, when something is to fix, what to do.

The pieces: the config and the store the CLI and the service share (``healthd.service_store``), the
results directory, Slurm, the topology, the site's Prometheus (does it scrape healthd, under the job
name the rules expect, and has it loaded healthd's alert rules: ``/api/v1/query`` and ``/api/v1/rules``),
and the node check at job boundaries (do nodes leave boundary documents). The interpreting functions
(``scrape_check``, ``rules_check``, ``boundary_check``) are pure; ``run_checks`` does the I/O, every
call with a timeout.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from healthd.config import Settings, is_service_config, service_config_path
from healthd.errors import HealthdError

Status = Literal["ok", "fix", "skipped"]
"""``ok``; ``fix``: something to do (``healthd doctor`` exits 1); ``skipped``: could not be checked here
(said why, and how to check it), which is not a failure."""

HEALTHD_JOB = "healthd"
"""The scrape job name the shipped alert rules select (``up{job="healthd"}``)."""
RULES_FILE = "grafana/alerts/healthd.rules.yml"
MISSED_QUERY = f'increase(healthd_node_check_missed_total{{job="{HEALTHD_JOB}"}}[1d]) > 0'
_ALERT = re.compile(r"^\s+- alert: (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    do: str = ""


def shipped_alerts(root: Path) -> frozenset[str]:
    """The alert names of the shipped rule file under ``root`` (``healthd.resources.data_root``)."""
    return frozenset(_ALERT.findall((root / RULES_FILE).read_text()))


def scrape_check(series: Sequence[Mapping[str, Any]], url: str, port: int) -> Check:
    """From the answer of ``healthd_build_info`` (its series' labels): whether Prometheus scrapes healthd,
    under the job name the rules expect."""
    name = "prometheus scrape"
    job = (f"- job_name: {HEALTHD_JOB}\n    static_configs: [{{targets: [\"<this host>:{port}\"]}}]")
    if not series:
        return Check(name, "fix", f"{url} has no healthd_build_info: it does not scrape healthd",
                     f"add to prometheus.yml's scrape_configs:\n  {job}\nthen reload Prometheus")
    jobs = sorted({str(s.get("job", "")) for s in series})
    targets = ", ".join(sorted({f"{s.get('job', '')}/{s.get('instance', '')}" for s in series}))
    if HEALTHD_JOB not in jobs:
        return Check(name, "fix", f"{url} scrapes healthd as job {', '.join(jobs)} ({targets})",
                     f"name the scrape job {HEALTHD_JOB!r}: the alert rules (HealthdDown...) select job=\"healthd\"")
    return Check(name, "ok", f"{url} scrapes healthd: {targets}")


def rules_check(groups: Sequence[Mapping[str, Any]], expected: Collection[str], url: str) -> Check:
    """From ``/api/v1/rules``' groups: whether Prometheus has loaded every healthd alert rule."""
    name = "prometheus rules"
    loaded = {str(r.get("name")) for g in groups for r in g.get("rules", ()) if r.get("type") == "alerting"}
    missing = sorted(set(expected) - loaded)
    fix = (f"add the shipped rules to prometheus.yml (rule_files: [/usr/share/healthd/{RULES_FILE.split('/', 1)[1]}]) "
           "and reload Prometheus; check the file with promtool check rules")
    if len(missing) == len(expected):
        return Check(name, "fix", f"{url} has none of healthd's {len(expected)} alert rules", fix)
    if missing:
        return Check(name, "fix", f"{url} lacks {len(missing)} of healthd's alert rules: {', '.join(missing)}",
                     fix.replace("add the shipped rules", "update the rule file from this healthd's"))
    return Check(name, "ok", f"{url} has all {len(expected)} healthd alert rules")


def missed_check(series: Sequence[Mapping[str, Any]], url: str) -> Check:
    """From ``increase(healthd_node_check_missed_total[1d]) > 0`` (the daemon's count of job ends not followed
    by a node check document, ``healthd.node_check_watch``): the nodes whose Epilog did not run the check."""
    name = "node check at job ends"
    nodes = sorted({str(s["metric"].get("node", "")) for s in series})
    if not nodes:
        return Check(name, "ok", f"no job end without a node check document in the last day ({url})")
    counts = {str(s["metric"].get("node", "")): float(s["value"][1]) for s in series}
    shown = ", ".join(f"{n} ({counts[n]:.0f})" for n in nodes[:10]) + (
        f" and {len(nodes) - 10} more" if len(nodes) > 10 else "")
    return Check(name, "fix", f"job ends without a node check document in the last day: {shown}",
                 "on each node: journalctl -t healthd-node-check says why its Epilog wrapper did not run the check")


def boundary_check(nodes: Sequence[str], with_documents: Collection[str], results_dir: Path) -> Check:
    """Whether the nodes leave node check documents (Prolog/Epilog/HealthCheckProgram, docs/slurm.md)."""
    name = "node check"
    silent = [n for n in nodes if n not in with_documents]
    how = ("on a silent node: journalctl -t healthd-node-check says why its wrapper did not run the check "
           f"(no Python at [slurm] python, no results directory {results_dir}); the slurm.conf lines come "
           "from healthd install-files (docs/slurm.md)")
    if not nodes:
        return Check(name, "skipped", "no nodes known to the store yet", "run this again once the service has "
                     "discovered the nodes")
    if len(silent) == len(nodes):
        return Check(name, "fix", f"none of the {len(nodes)} nodes has left a boundary document: the node check "
                     "is not running", how)
    if silent:
        shown = ", ".join(silent[:10]) + (f" and {len(silent) - 10} more" if len(silent) > 10 else "")
        return Check(name, "fix", f"{len(silent)} of {len(nodes)} nodes left no boundary document: {shown}", how)
    return Check(name, "ok", f"all {len(nodes)} nodes left boundary documents")


def store_checks(settings: Settings, config_path: Path | None) -> tuple[list[Check], list[str] | None, set[str]]:
    """The config and store checks, and the store's nodes (``None``: no store) and those with a boundary
    document."""
    from healthd.collector import results_dir_problem
    from healthd.http import nodes_document
    from healthd.service_store import open_store, service_user

    service = is_service_config(config_path)
    where = (f"{config_path} (the service's config)" if service else
             f"{config_path or 'built-in defaults'} (not the service's config, {service_config_path()})")
    checks = [Check("config", "ok" if service or config_path else "fix", where,
                    "" if service or config_path else
                    f"install the config at {service_config_path()} (healthd install-files) and edit it")]
    user = service_user(settings)
    owner = f"; the service's user: {user.name} ({user.source})" if user else ""
    try:
        store = open_store(settings, config_path, write=False, command="doctor")
    except HealthdError as exc:
        checks.append(Check("store", "fix", str(exc), "start the service (systemctl start healthd) and see its "
                            "log (journalctl -u healthd) when it does not start"))
        return checks, None, set()
    try:
        doc = nodes_document(store.snapshot(), None)
        version = store.schema_version
    finally:
        store.close()
    checks.append(Check("store", "ok", f"{settings.store_path} (schema {version}{owner})"))
    problem = results_dir_problem(settings.results_dir, owner=user.uid if user else None)
    checks.append(Check("results directory", "fix" if problem else "ok", problem or str(settings.results_dir),
                        "see healthd check-config" if problem else ""))
    nodes = [n["name"] for n in doc["nodes"]]
    return checks, nodes, {n["name"] for n in doc["nodes"] if "boundary" in n["probes"]}


def slurm_checks(settings: Settings) -> list[Check]:
    """Which Slurm (its version and node count) and which topology, as the service would read them."""
    from healthd.cluster import make_backend, slurm_answers
    from healthd.cluster.slurm import SlurmBackend
    from healthd.cluster.topology import read_topology
    from healthd.topology import describe

    if settings.backend == "local" or (settings.backend == "auto" and not slurm_answers(settings)):
        why = "backend = \"local\"" if settings.backend == "local" else "backend = \"auto\" and no sinfo answered"
        return [Check("slurm", "skipped", f"no Slurm ({why}): probes run on this machine",
                      "for a Slurm cluster: put Slurm's client commands on PATH (or [slurm] bin_dir) with munge")]
    try:
        backend = make_backend(settings, runs_probes=False)
        nodes = backend.list_nodes()
        version = ".".join(map(str, backend.client.version())) if isinstance(backend, SlurmBackend) else "?"
    except HealthdError as exc:
        return [Check("slurm", "fix", f"Slurm does not answer: {exc}",
                      "check sinfo as the service's user; munge and slurmctld must be up")]
    checks = [Check("slurm", "ok", f"Slurm {version}: {len(nodes)} nodes in healthd's partitions")]
    try:
        topology = read_topology(settings.topology, backend)
    except HealthdError as exc:
        return [*checks, Check("topology", "fix", f"cannot read the topology: {exc}", "see [topology] in the config")]
    checks.append(Check("topology", "ok", describe(topology)) if topology is not None else Check(
        "topology", "skipped", describe(None),
        "for switch findings: Slurm's topology/tree or topology/block, or [topology] file"))
    return checks


Fetch = Callable[[str], Any]
"""GET of a Prometheus API path (``/api/v1/...``): its ``data``; raises ``HealthdError``."""


def prometheus_fetch(url: str, headers: Mapping[str, str], timeout_s: float) -> Fetch:
    def fetch(path: str) -> Any:
        request = urllib.request.Request(url.rstrip("/") + path, headers=dict(headers))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout_s) as response:
                doc = json.loads(response.read(64 << 20))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            raise HealthdError(f"cannot ask {url}{path.split('?')[0]}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise HealthdError(f"{url}{path.split('?')[0]} answered {str(doc)[:200]}")
        return doc["data"]
    return fetch


def prometheus_checks(url: str | None, fetch: Fetch | None, port: int, expected: Collection[str]) -> list[Check]:
    if url is None or fetch is None:
        return [Check("prometheus", "skipped", "no Prometheus to ask",
                      "pass --prometheus URL (or set [passive] prometheus_url) to check its scrape and rules")]
    try:
        series = [r["metric"] for r in fetch("/api/v1/query?query=healthd_build_info")["result"]]
        groups = fetch("/api/v1/rules?type=alert")["groups"]
        missed = fetch("/api/v1/query?query=" + urllib.parse.quote(MISSED_QUERY))["result"]
    except (HealthdError, KeyError, TypeError) as exc:
        return [Check("prometheus", "fix", f"{exc}", "check the URL, and that Prometheus runs")]
    return [scrape_check(series, url, port), rules_check(groups, expected, url), missed_check(missed, url)]


def report(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": all(c.status != "fix" for c in checks), "checks": [asdict(c) for c in checks]}


def format_report(checks: Sequence[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{ {'ok': 'ok', 'fix': 'FIX', 'skipped': '--'}[c.status] :>3}] {c.name}: {c.found}")
        if c.do:
            lines += [f"      {'do' if c.status == 'fix' else 'to check'}: {line}" for line in c.do.splitlines()]
    bad = sum(c.status == "fix" for c in checks)
    lines.append("all good" if not bad else f"{bad} thing(s) to fix")
    return "\n".join(lines)
