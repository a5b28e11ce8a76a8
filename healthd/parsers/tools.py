"""Registry of the standard-tool parsers: tool name -> parse function and converter.

``TOOLS[name].parse(text)`` gives the tool's typed, frozen result (``ParseError`` on
unreadable output); ``TOOLS[name].convert(parsed, node=..., at=...)`` turns it into
``ProbeResult`` documents of probe ``TOOLS[name].probe``. ``results_from_text`` does both.
Raw bytes from a subprocess go through ``decode_output`` first (invalid UTF-8 replaced, so
every parser sees text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar, get_args

from healthd.parsers import dcgmi, ddp_benchmark, horovod, nccl_tests, param
from probes.result import ProbeResult

__all__ = ["TOOLS", "TOOL_NAMES", "ToolName", "ToolParser", "decode_output", "parse_tool_output", "results_from_text"]

ToolName = Literal["nccl-tests", "param-comms", "param-compute", "ddp-benchmark", "horovod", "dcgmi"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ToolParser(Generic[T]):
    """A tool's parse function, its converter and the probe name the converter uses."""

    name: ToolName
    probe: str
    parse: Callable[[str], T]
    convert: Callable[..., list[ProbeResult]]

    def results(self, text: str, *, node: str | None = None, at: float | None = None) -> list[ProbeResult]:
        return self.convert(self.parse(text), node=node, at=at)


TOOLS: Mapping[str, ToolParser[Any]] = MappingProxyType(
    {
        "nccl-tests": ToolParser("nccl-tests", "nccl_tests", nccl_tests.parse_nccl_tests, nccl_tests.to_probe_results),
        "param-comms": ToolParser("param-comms", "param_comms", param.parse_param_comms, param.comms_to_probe_results),
        "param-compute": ToolParser(
            "param-compute", "param_compute", param.parse_param_compute, param.compute_to_probe_results
        ),
        "ddp-benchmark": ToolParser(
            "ddp-benchmark", "ddp_benchmark", ddp_benchmark.parse_ddp_benchmark, ddp_benchmark.to_probe_results
        ),
        "horovod": ToolParser("horovod", "horovod", horovod.parse_horovod, horovod.to_probe_results),
        "dcgmi": ToolParser("dcgmi", "dcgmi", dcgmi.parse_dcgmi, dcgmi.to_probe_results),
    }
)
"""Every registered tool by name (the keys are exactly ``ToolName``'s values)."""

TOOL_NAMES: tuple[str, ...] = get_args(ToolName)


def _lookup(tool: str) -> ToolParser[Any]:
    try:
        return TOOLS[tool]
    except KeyError:
        raise ValueError(f"unknown tool {tool!r}; known tools: {', '.join(sorted(TOOLS))}") from None


def decode_output(data: bytes) -> str:
    """Decode subprocess output as UTF-8, replacing undecodable bytes."""
    return data.decode("utf-8", errors="replace")


def parse_tool_output(tool: str, text: str) -> object:
    """Parse ``text`` with ``tool``'s parser. ``ValueError`` for an unknown tool name,
    ``ParseError`` for unreadable output."""
    return _lookup(tool).parse(text)


def results_from_text(tool: str, text: str, *, node: str | None = None, at: float | None = None) -> list[ProbeResult]:
    """Parse ``text`` with ``tool``'s parser and convert it to ``ProbeResult`` documents."""
    return _lookup(tool).results(text, node=node, at=at)
