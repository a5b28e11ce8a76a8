"""Parser for ``dcgmi diag -r N`` output, as the text table or the ``-j`` JSON document.

Text: a 78-column table after ``Successfully ran diagnostic for group.``; sections
(``|-----  Deployment  ---...|``), test rows (``| GPU Memory | Pass - All |``), per-GPU rows
(``|  | Fail - GPU: 1 |`` in DCGM 3, ``|  | GPU0: Pass |`` in DCGM 4) and ``Info`` /
``Warning`` / ``Error`` rows whose text DCGM wraps at a fixed width, mid-word, over
continuation rows with an empty name cell. Wrapped text is re-joined by position: every
row but the last contributes exactly the wrap width (cell width - 3) characters.

JSON: DCGM 2.x/3.x ``{"DCGM GPU Diagnostic": {"test_categories": [...]}}`` with
``gpu_ids`` and string ``info``/``warnings``; DCGM 4.x ``{"DCGM Diagnostic": ...}`` with
``entity_group``/``entity_id`` per result, ``info`` lists, ``warnings`` objects
(``warning``, ``error_id``...), ``test_summary`` and top-level ``metadata``. Noise before the
document (a ``WARNING:`` line) is skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from healthd.errors import ParseError
from healthd.parsers.common import check_json_values, tool_result
from probes.result import Check, Outcome, ProbeResult

__all__ = [
    "DcgmiDiag",
    "DcgmiGpuResult",
    "DcgmiMessage",
    "DcgmiTest",
    "Status",
    "parse_dcgmi",
    "to_probe_results",
]

PROBE = "dcgmi"
Status = Literal["pass", "fail", "warn", "skip", "not_run"]
MessageKind = Literal["info", "warning", "error"]

_SEVERITY: dict[Status, int] = {"fail": 4, "warn": 3, "pass": 2, "not_run": 1, "skip": 0}


@dataclass(frozen=True, slots=True)
class DcgmiGpuResult:
    """A status for one GPU, or for all GPUs of the test when ``gpu`` is ``None``."""

    gpu: int | None
    status: Status


@dataclass(frozen=True, slots=True)
class DcgmiMessage:
    kind: MessageKind
    text: str
    gpu: int | None
    line: int


@dataclass(frozen=True, slots=True)
class DcgmiTest:
    category: str | None
    name: str
    status: Status
    results: tuple[DcgmiGpuResult, ...]
    messages: tuple[DcgmiMessage, ...]
    line: int

    @property
    def failed_gpus(self) -> tuple[int, ...]:
        return tuple(r.gpu for r in self.results if r.status == "fail" and r.gpu is not None)


@dataclass(frozen=True, slots=True)
class DcgmiDiag:
    format: Literal["text", "json"]
    dcgm_version: str | None
    driver_version: str | None
    gpu_device_ids: tuple[str, ...]
    tests: tuple[DcgmiTest, ...]
    messages: tuple[DcgmiMessage, ...]
    errors: tuple[str, ...]
    complete: bool

    @property
    def status(self) -> Status | None:
        """The worst status over all tests (``None`` without tests)."""
        if not self.tests:
            return None
        return _worst(t.status for t in self.tests)


def _norm_status(text: str) -> Status | None:
    word = text.strip().lower().replace("_", " ")
    if word in ("pass", "passed"):
        return "pass"
    if word in ("fail", "failed", "failure"):
        return "fail"
    if word in ("warn", "warning"):
        return "warn"
    if word in ("skip", "skipped"):
        return "skip"
    if word in ("not run", "notrun", "not applicable"):
        return "not_run"
    return None


def _severity(status: Status) -> int:
    return _SEVERITY[status]


def _worst(statuses: Iterable[Status]) -> Status | None:
    items: list[Status] = list(statuses)
    if not items:
        return None
    worst: Status = max(items, key=_severity)
    return worst


_GPU_IN_TEXT = re.compile(r"^GPU ?(\d{1,4})\b")


def _gpu_of(text: str) -> int | None:
    m = _GPU_IN_TEXT.match(text.strip())
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- text

_SECTION = re.compile(r"^[|+]-{3,}\s+(?P<name>[A-Za-z][A-Za-z /]{0,40}?)\s+-+[+|]")
_RESULT = re.compile(
    r"^(?P<status>Pass|Fail|Warn|Skip|Not Run|PASS|FAIL|WARN|SKIP|Skipped|Passed|Failed)"
    r"(?:\s*-\s*(?P<scope>.*))?$"
)
_PER_GPU = re.compile(r"^GPU ?(?P<gpu>\d{1,4})\s*:\s*(?P<status>Pass|Fail|Warn|Skip|Not Run|PASS|FAIL|WARN|SKIP)\b")
_GPU_LIST = re.compile(r"^(?:GPUs?|GPU\(s\))\s*:?\s*(?P<ids>\d{1,4}(?:\s*,\s*\d{1,4})*)")
_METADATA = {
    "DCGM Version": "version",
    "Driver Version Detected": "driver",
    "GPU Device IDs Detected": "ids",
}


@dataclass
class _TestBuilder:
    category: str | None
    name: str
    line: int
    results: list[DcgmiGpuResult] = field(default_factory=list)
    messages: list[DcgmiMessage] = field(default_factory=list)

    def build(self) -> DcgmiTest:
        status = _worst(r.status for r in self.results) or "not_run"
        return DcgmiTest(self.category, self.name, status, tuple(self.results), tuple(self.messages), self.line)


def _scope_results(status: Status, scope: str | None) -> list[DcgmiGpuResult] | None:
    if scope is None or not scope.strip() or scope.strip().lower() == "all":
        return [DcgmiGpuResult(None, status)]
    m = _GPU_LIST.match(scope.strip())
    if not m:
        return None
    return [DcgmiGpuResult(int(x), status) for x in re.findall(r"\d{1,4}", m.group("ids"))]


def _parse_text(text: str) -> DcgmiDiag:
    tests: list[DcgmiTest] = []
    loose: list[DcgmiMessage] = []
    errors: list[str] = []
    meta: dict[str, str] = {}
    section: str | None = None
    current: _TestBuilder | None = None
    message: tuple[MessageKind, list[str], int, int] | None = None
    saw_table = False
    saw_success = False
    closed = False

    def flush_message() -> None:
        nonlocal message
        if message is None:
            return
        kind, chunks, width, lineno = message
        joined = "".join(c[:width].ljust(width) for c in chunks[:-1]) + chunks[-1].rstrip()
        msg = DcgmiMessage(kind, joined.strip(), _gpu_of(joined), lineno)
        if current is not None:
            current.messages.append(msg)
        else:
            loose.append(msg)
        message = None

    def flush_test() -> None:
        nonlocal current
        flush_message()
        if current is not None:
            tests.append(current.build())
        current = None

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Successfully ran diagnostic"):
            saw_success = True
            continue
        if stripped.startswith("Error:") or stripped.startswith("Error "):
            errors.append(stripped)
            continue
        sec = _SECTION.match(stripped)
        if sec:
            flush_test()
            section = sec.group("name").strip()
            saw_table = True
            continue
        if stripped.startswith("+") and set(stripped) <= {"+", "-", "="}:
            flush_message()
            saw_table = True
            if set(stripped) <= {"+", "-"} and tests:
                closed = True
            continue
        if not stripped.startswith("|"):
            continue
        saw_table = True
        parts = stripped.split("|")
        if len(parts) < 3:
            continue
        name_cell = parts[1]
        value_cell = parts[2]
        name = name_cell.strip()
        value = value_cell.strip()
        width = max(len(value_cell) - 3, 1) if len(parts) >= 4 else 45
        chunk = value_cell[1:] if value_cell.startswith(" ") else value_cell
        if name == "Diagnostic" and value == "Result":
            continue
        if section == "Metadata" and name:
            meta[_METADATA.get(name, name)] = value
            continue
        if name in ("Info", "Warning", "Error"):
            flush_message()
            kind: MessageKind = "info" if name == "Info" else "warning" if name == "Warning" else "error"
            message = (kind, [chunk], width, lineno)
            continue
        if not name:
            per_gpu = _PER_GPU.match(value)
            result = _RESULT.match(value) if per_gpu is None else None
            if message is not None and per_gpu is None and (result is None or current is None):
                kind_, chunks, width_, start = message
                chunks.append(chunk)
                message = (kind_, chunks, width_, start)
                continue
            if current is not None and per_gpu is not None:
                flush_message()
                status = _norm_status(per_gpu.group("status"))
                if status is not None:
                    current.results.append(DcgmiGpuResult(int(per_gpu.group("gpu")), status))
                continue
            if current is not None and result is not None:
                flush_message()
                status = _norm_status(result.group("status"))
                scoped = _scope_results(status, result.group("scope")) if status else None
                if scoped is not None:
                    current.results.extend(scoped)
                continue
            continue
        flush_test()
        result = _RESULT.match(value)
        current = _TestBuilder(section, name, lineno)
        if result is not None:
            status = _norm_status(result.group("status"))
            scoped = _scope_results(status, result.group("scope")) if status else None
            if scoped is not None:
                current.results.extend(scoped)
            elif status is not None:
                current.results.append(DcgmiGpuResult(None, status))
                current.messages.append(DcgmiMessage("info", result.group("scope") or "", None, lineno))
        else:
            current.messages.append(DcgmiMessage("info", value, None, lineno))
    flush_test()
    if not saw_table and not errors:
        raise ParseError(
            "dcgmi: no diagnostic output found: expected the '| Diagnostic | Result |' table "
            "(after 'Successfully ran diagnostic for group.') or a JSON document"
        )
    ids = tuple(x.strip() for x in meta.get("ids", "").split(",") if x.strip())
    return DcgmiDiag(
        format="text",
        dcgm_version=meta.get("version"),
        driver_version=meta.get("driver"),
        gpu_device_ids=ids,
        tests=tuple(tests),
        messages=tuple(loose),
        errors=tuple(errors),
        complete=saw_success and closed,
    )


# --------------------------------------------------------------------------- JSON


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _json_gpus(result: dict[str, Any]) -> list[int | None]:
    if "entity_id" in result:
        group = result.get("entity_group")
        eid = result.get("entity_id")
        if isinstance(eid, int) and not isinstance(eid, bool) and (group in (None, "GPU")):
            return [eid]
        return [None]
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(ids, int) and not isinstance(ids, bool):
        return [ids]
    if isinstance(ids, str) and ids.strip():
        found = [int(x) for x in re.findall(r"\d{1,4}", ids)]
        return list(found) if found else [None]
    return [None]


def _json_texts(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    out: list[str] = []
    for item in _as_list(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            text = item.get("warning", item.get("error", item.get("message")))
            if isinstance(text, str):
                out.append(text)
    return out


def _parse_json(text: str) -> DcgmiDiag:
    start = text.find("{")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:] if start >= 0 else text)
    except json.JSONDecodeError as exc:
        line = text.count("\n", 0, max(start, 0)) + exc.lineno
        raise ParseError(f"dcgmi JSON: {exc.msg} at line {line} column {exc.colno}") from exc
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"dcgmi JSON: unreadable document ({exc.__class__.__name__})") from exc
    if not isinstance(doc, dict):
        raise ParseError("dcgmi JSON: expected an object at the top level")
    check_json_values(doc, "dcgmi JSON")
    root_key = next((k for k in ("DCGM GPU Diagnostic", "DCGM Diagnostic") if k in doc), None)
    if root_key is None:
        raise ParseError("dcgmi JSON: expected a 'DCGM GPU Diagnostic' or 'DCGM Diagnostic' object")
    root = _as_dict(doc[root_key])
    metadata = _as_dict(doc.get("metadata"))
    tests: list[DcgmiTest] = []
    for cat in _as_list(root.get("test_categories")):
        if not isinstance(cat, dict):
            continue
        category = cat.get("category") if isinstance(cat.get("category"), str) else None
        for test in _as_list(cat.get("tests")):
            if not isinstance(test, dict) or not isinstance(test.get("name"), str):
                continue
            results: list[DcgmiGpuResult] = []
            messages: list[DcgmiMessage] = []
            for result in _as_list(test.get("results")):
                if not isinstance(result, dict):
                    continue
                status = _norm_status(str(result.get("status", "")))
                gpus = _json_gpus(result)
                if status is not None:
                    results.extend(DcgmiGpuResult(g, status) for g in gpus)
                single = gpus[0] if len(gpus) == 1 else None
                for info in _json_texts(result.get("info")):
                    messages.append(DcgmiMessage("info", info, single if single is not None else _gpu_of(info), 0))
                for warning in _json_texts(result.get("warnings")):
                    messages.append(
                        DcgmiMessage("warning", warning, single if single is not None else _gpu_of(warning), 0)
                    )
            summary = _as_dict(test.get("test_summary"))
            summary_status = _norm_status(str(summary.get("status", "")))
            for info in _json_texts(summary.get("info")):
                messages.append(DcgmiMessage("info", info, _gpu_of(info), 0))
            statuses: list[Status] = [r.status for r in results]
            if summary_status is not None:
                statuses.append(summary_status)
            status = _worst(statuses) or "not_run"
            tests.append(DcgmiTest(category, test["name"], status, tuple(results), tuple(messages), 0))
    errors = [e for e in _json_texts(root.get("runtime_error")) + _json_texts(doc.get("runtime_error"))]
    errors += _json_texts(root.get("errors")) + _json_texts(doc.get("global_errors"))
    version = root.get("version", metadata.get("version"))
    driver = root.get("Driver Version Detected", metadata.get("Driver Version Detected"))
    ids_value = root.get("GPU Device IDs Detected", metadata.get("GPU Device IDs Detected"))
    ids = tuple(x.strip() for x in ids_value.split(",") if x.strip()) if isinstance(ids_value, str) else ()
    return DcgmiDiag(
        format="json",
        dcgm_version=version if isinstance(version, str) else None,
        driver_version=driver if isinstance(driver, str) else None,
        gpu_device_ids=ids,
        tests=tuple(tests),
        messages=(),
        errors=tuple(errors),
        complete=True,
    )


def parse_dcgmi(text: str) -> DcgmiDiag:
    """Parse ``dcgmi diag`` output (text table or ``-j`` JSON, detected by content)."""
    if not isinstance(text, str):
        raise ParseError(f"dcgmi: expected text (str), got {type(text).__name__}")
    first_brace = text.find("{")
    first_pipe = text.find("|")
    if first_brace >= 0 and (first_pipe < 0 or first_brace < first_pipe) and '"DCGM' in text:
        return _parse_json(text)
    return _parse_text(text)


# --------------------------------------------------------------------------- converter


def to_probe_results(parsed: DcgmiDiag, *, node: str | None = None, at: float | None = None) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``dcgmi``): a ``Check`` per test and GPU (``ok`` unless the
    status is ``fail``), per ``Error`` row, outcome ``fail`` on any failure, ``error`` when
    DCGM reported an error without running tests, ``skipped`` when every test was skipped."""
    checks: list[Check] = []
    for test in parsed.tests:
        detail_msgs = "; ".join(m.text for m in test.messages if m.kind != "info")[:500]
        for result in test.results:
            checks.append(
                Check(
                    name=f"dcgmi.{test.name}",
                    ok=result.status != "fail",
                    detail=f"{result.status}" + (f": {detail_msgs}" if detail_msgs and result.status != "pass" else ""),
                    node=node,
                    gpu=result.gpu,
                )
            )
        for msg in test.messages:
            if msg.kind == "error":
                checks.append(
                    Check(name=f"dcgmi.{test.name}.error", ok=False, detail=msg.text[:500], node=node, gpu=msg.gpu)
                )
    for msg in parsed.messages:
        if msg.kind == "error":
            checks.append(Check(name="dcgmi.error", ok=False, detail=msg.text[:500], node=node, gpu=msg.gpu))
    statuses = [t.status for t in parsed.tests]
    failing = [t.name for t in parsed.tests if t.status == "fail"]
    error_rows = [m for m in parsed.messages if m.kind == "error"] + [
        m for t in parsed.tests for m in t.messages if m.kind == "error"
    ]
    if failing or error_rows:
        names = failing + [m.text[:80] for m in error_rows if not failing]
        outcome, reason = Outcome.FAIL, "dcgmi diag failed: " + ", ".join(names)
    elif parsed.errors and not parsed.tests:
        outcome, reason = Outcome.ERROR, parsed.errors[0][:500]
    elif not parsed.tests:
        outcome, reason = Outcome.ERROR, "no diagnostic results"
    elif all(s in ("skip", "not_run") for s in statuses):
        outcome, reason = Outcome.SKIPPED, "every diagnostic was skipped"
    else:
        warned = [t.name for t in parsed.tests if t.status == "warn"]
        outcome, reason = Outcome.PASS, ("warnings: " + ", ".join(warned)) if warned else ""
    params: dict[str, Any] = {
        "tool": "dcgmi",
        "format": parsed.format,
        "dcgm_version": parsed.dcgm_version,
        "driver_version": parsed.driver_version,
        "tests": {t.name: t.status for t in parsed.tests},
        "complete": parsed.complete,
    }
    return [tool_result(PROBE, outcome, reason, params, at=at, node=node, checks=checks)]
