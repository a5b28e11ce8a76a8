from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.integration.daemons"]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reads the developer's /etc/healthd, $HEALTHD_* or state directory."""
    for key in list(os.environ):
        if (key.startswith("HEALTHD_") and key != "HEALTHD_UPDATE_GOLDEN") or key in (
                "STATE_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    monkeypatch.setattr("healthd.config.DEFAULT_CONFIG_PATH", tmp_path_factory.mktemp("etc") / "none.toml")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``HEALTHD_REQUIRE_SLURM=1`` (CI), a Slurm test that would skip for want of a cluster fails."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if (
        os.environ.get("HEALTHD_REQUIRE_SLURM") == "1"
        and report.skipped
        and item.get_closest_marker("slurm") is not None
        and "no Slurm test cluster" in str(report.longrepr)
    ):
        report.outcome = "failed"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every ``slurm`` test lives under tests/integration (``scripts/slurm-matrix.sh`` collects only there)
    and ``slurm_release`` marks ``slurm`` tests only. ``containers`` tests run last, in their own order:
    the probe image they need is built in the background by scripts/test.sh while the rest run."""
    integration = Path(__file__).resolve().parent / "integration"
    misplaced = [item.nodeid for item in items if (
        item.get_closest_marker("slurm_release") is not None and item.get_closest_marker("slurm") is None
    ) or (item.get_closest_marker("slurm") is not None and integration not in item.path.resolve().parents)]
    if misplaced:
        raise pytest.UsageError(f"slurm tests must be under tests/integration and slurm_release ones slurm too: "
                                f"{misplaced}")
    last = [item for item in items if item.get_closest_marker("containers") is not None]
    if last:
        items[:] = [item for item in items if item.get_closest_marker("containers") is None] + last
