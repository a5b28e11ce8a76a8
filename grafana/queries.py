"""Read the PromQL out of healthd's dashboard JSON: panel targets, query variables, and Grafana's own variables.

Used by the tests (``tests/unit/test_dashboards.py`` checks every query with promtool,
``tests/integration/test_prometheus_reality.py`` runs every query against a real Prometheus). Standard library
only, so it works without grafana-foundation-sdk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")
VARIABLE_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
METRIC_NAME = re.compile(r"\bhealthd_[a-z0-9_]+\b")
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"})


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel_id: int
    panel: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def key(self) -> str:
        return f"{self.dashboard}/{self.panel}/{self.ref_id}"


@dataclass(frozen=True)
class QueryVariable:
    dashboard: str
    name: str
    selector: str
    label: str
    include_all: bool
    all_value: str | None
    numeric_desc: bool


def dashboards(directory: Path = DASHBOARD_DIR) -> dict[str, dict[str, Any]]:
    """Every committed dashboard, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def panels(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, with the panels of collapsed rows."""
    for panel in doc.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(doc: Mapping[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(doc["uid"], panel["id"], panel["title"], target["refId"], target["expr"],
                   bool(target.get("instant")))
        for panel in panels(doc) if panel["type"] != "row"
        for target in panel.get("targets", [])
    ]


def query_variables(doc: Mapping[str, Any]) -> list[QueryVariable]:
    """The ``label_values(selector, label)`` variables, in dashboard order (later ones may use earlier ones)."""
    out = []
    for var in doc.get("templating", {}).get("list", []):
        if var["type"] != "query":
            continue
        text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        found = LABEL_VALUES.match(text)
        if found is None:
            raise ValueError(f"{doc['uid']}: variable {var['name']} is not label_values(...): {text!r}")
        out.append(QueryVariable(doc["uid"], var["name"], found["selector"], found["label"],
                                 bool(var.get("includeAll")), var.get("allValue"), var.get("sort") == 4))
    return out


def variable_names(doc: Mapping[str, Any]) -> set[str]:
    return {var["name"] for var in doc.get("templating", {}).get("list", [])}


def referenced_variables(text: str) -> set[str]:
    return {a or b for a, b in VARIABLE_REF.findall(text)}


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` and ``${name}`` as Grafana does; an unknown name raises ``KeyError``."""
    return VARIABLE_REF.sub(lambda m: values[m.group(1) or m.group(2)], text)


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))
