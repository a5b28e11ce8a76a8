"""Files shipped with healthd besides code: systemd units, Grafana dashboards and alert rules,
the example config. In a wheel they live in ``healthd/_data``; in a source checkout, at the
top of the repository."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
DATA_DIRS = ("systemd", "grafana")
EXAMPLE_CONFIG = "healthd.example.toml"


def data_root() -> Path:
    """The directory holding ``systemd/``, ``grafana/`` and the example config."""
    shipped = _PACKAGE / "_data"
    if shipped.is_dir():
        return shipped
    checkout = _PACKAGE.parent
    if (checkout / EXAMPLE_CONFIG).is_file():
        return checkout
    raise FileNotFoundError(f"healthd's data files are missing (looked in {shipped} and {checkout})")
