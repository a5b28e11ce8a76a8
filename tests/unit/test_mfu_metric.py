"""``healthd_ddp_mfu_ratio``: the DDP probe's model FLOP/s over the node class's peak, at scrape time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from healthd.metrics import StoreCollector
from healthd.model import Node
from healthd.parsers.healthd_json import parse_result
from healthd.store import Store

DDP = Path(__file__).resolve().parents[1] / "fixtures" / "promtool" / "probe_results" / "ddp.json"


def _registry(tmp_path: Path, node_class: str, flops: float, dtype: str) -> CollectorRegistry:
    doc = json.loads(DDP.read_text())
    for m in doc["measurements"]:
        if m["name"] == "model_flop_per_second":
            m["value"], m["labels"] = flops, {"dtype": dtype}
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("vm", "idle", gpus=8, node_class=node_class)], 1.0)
    store.record_result(parse_result(json.dumps(doc)), nodes=["vm"], backend="local", source="test",
                        result_path=None)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store.snapshot, lambda: "local"))
    return registry


def test_mfu_is_model_flops_over_the_class_peak(tmp_path: Path) -> None:
    # 60.95 TFLOP/s bf16 on an H100 SXM class (989.4 TFLOP/s dense): 6.16%
    v = _registry(tmp_path, "h100x8", 6.094848e13, "bf16").get_sample_value
    assert v("healthd_ddp_model_flop_per_second", {"node": "vm", "dtype": "bf16"}) == 6.094848e13
    assert v("healthd_ddp_mfu_ratio", {"node": "vm", "dtype": "bf16"}) == pytest.approx(0.0616015, rel=1e-5)


def test_no_mfu_without_a_peak(tmp_path: Path) -> None:
    v = _registry(tmp_path, "local", 3e9, "fp32").get_sample_value
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
