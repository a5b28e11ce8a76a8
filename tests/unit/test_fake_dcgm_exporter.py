"""The fake dcgm-exporter: its exposition parses as Prometheus text; as a subprocess, ``POST /control`` changes it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.dcgm_exporter import FakeDcgmExporter, fake_uuid

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.removesuffix("_total") == name.removesuffix("_total")
            or family.name == name]


def test_the_exposition_follows_dcgm_exporters_labels_and_types() -> None:
    exporter = FakeDcgmExporter(["n1", "n2"], gpus=2, xid_count=True, health=True)
    exporter.set_host_label("n2", "hostname")
    text = exporter.render()
    assert "# TYPE DCGM_FI_DEV_XID_ERRORS gauge" in text
    assert "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered." in text
    xid = samples(text, "DCGM_FI_DEV_XID_ERRORS")
    assert len(xid) == 4
    first = next(iter(xid))[0]
    assert list(first)[:6] == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
    assert first["err_code"] == "0" and first["err_msg"] == "No Error"
    assert any("hostname" in labels for labels, _ in xid)
    counts = samples(text, "DCGM_EXP_XID_ERRORS_COUNT")
    assert {v for _, v in counts} == {0.0} and all("xid" not in labels for labels, _ in counts)
    assert len(samples(text, "DCGM_EXP_GPU_HEALTH_STATUS")) == 2 * 2 * 11


def test_run_as_a_subprocess_and_changed_through_control() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.dcgm_exporter", "--port", "0", "--nodes", "a,b",
                             "--gpus", "2", "--xid-count"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        body = json.dumps({"op": "xid", "node": "b", "gpu": 1, "xid": 79}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/control", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        only_b = get(f"http://127.0.0.1:{port}/metrics?node=b")
        xid = {labels["gpu"]: (labels, v) for labels, v in samples(only_b, "DCGM_FI_DEV_XID_ERRORS")}
        assert set(xid) == {"0", "1"} and xid["1"][1] == 79.0
        assert xid["1"][0]["UUID"] == fake_uuid("b", 1) and xid["1"][0]["err_msg"] == "GPU has fallen off the bus"
        counted = [(labels.get("xid"), v) for labels, v in samples(only_b, "DCGM_EXP_XID_ERRORS_COUNT")]
        assert sorted(counted, key=str) == sorted([("79", 1.0), (None, 0.0)], key=str)
        assert "Hostname=\"a\"" in get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
