"""``healthd_ddp_mfu_ratio``: the DDP probe's model FLOP/s over the node class's peak, at scrape time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healthd.metrics import Detail, render_text
from healthd.model import Node
from healthd.parsers.healthd_json import parse_result
from healthd.store import Store

DDP = Path(__file__).resolve().parents[1] / "fixtures" / "promtool" / "probe_results" / "ddp.json"


def _scrape(tmp_path: Path, node_class: str, flops: float, dtype: str,
            detail: Detail = "full") -> Callable[[str, dict[str, str]], float | None]:
    doc = json.loads(DDP.read_text())
    for m in doc["measurements"]:
        if m["name"] == "model_flop_per_second":
            m["value"], m["labels"] = flops, {"dtype": dtype}
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("vm", "idle", gpus=8, node_class=node_class)], 1.0)
    store.record_result(parse_result(json.dumps(doc)), nodes=["vm"], backend="local", source="test",
                        result_path=None)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(render_text(store, "local", detail)) for s in f.samples}
    return lambda name, labels: samples.get((name, tuple(sorted(labels.items()))))


def test_mfu_is_model_flops_over_the_class_peak(tmp_path: Path) -> None:
    # 60.95 TFLOP/s bf16 on an H100 SXM class (989.4 TFLOP/s dense): 6.16%
    v = _scrape(tmp_path, "h100x8", 6.094848e13, "bf16")
    assert v("healthd_ddp_model_flop_per_second", {"node": "vm", "dtype": "bf16"}) == 6.094848e13
    assert v("healthd_ddp_mfu_ratio", {"node": "vm", "dtype": "bf16"}) == pytest.approx(0.0616015, rel=1e-5)


def test_the_summary_detail_exports_the_mfu_not_the_model_flops(tmp_path: Path) -> None:
    v = _scrape(tmp_path, "h100x8", 6.094848e13, "bf16", detail="summary")
    assert v("healthd_ddp_mfu_ratio", {"node": "vm", "dtype": "bf16"}) == pytest.approx(0.0616015, rel=1e-5)
    assert v("healthd_ddp_model_flop_per_second", {"node": "vm", "dtype": "bf16"}) is None


def test_no_mfu_without_a_peak(tmp_path: Path) -> None:
    v = _scrape(tmp_path, "local", 3e9, "fp32")
    assert v("healthd_ddp_model_flop_per_second", {"node": "vm", "dtype": "fp32"}) == 3e9
    assert v("healthd_ddp_mfu_ratio", {"node": "vm", "dtype": "fp32"}) is None


@pytest.mark.parametrize(("node_class", "floor", "peak"), [
    ("h100x8", 30e12, 989.4e12), ("nvidia_h100_pcie_80gbx2", 25e12, 756e12), ("nvidia_h200x8", 30e12, 989.4e12),
    ("a100x8", 12e12, 312e12)])
def test_ddp_floors_catch_a_broken_node_not_a_slow_one(node_class: str, floor: float, peak: float) -> None:
    from healthd.judge.floors import find_floor, packaged_floors
    from healthd.judge.model import SeriesKey
    from healthd.judge.peaks import peak_flops

    rule = find_floor(packaged_floors(), node_class, SeriesKey.of("ddp", "model_flop_per_second", {"dtype": "bf16"}))
    assert rule is not None and rule.value == floor and rule.source
    assert peak_flops(node_class, "bf16") == peak
    assert 0.03 <= floor / peak < 0.04  # a third of an uncompiled GPT-2-small step's ~12% MFU
    assert find_floor(packaged_floors(), "cpu", SeriesKey.of("ddp", "model_flop_per_second", {"dtype": "fp32"})) is None
