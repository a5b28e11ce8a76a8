"""Cluster backends and the choice between them (``backend = auto | local | slurm``)."""

from __future__ import annotations

import shutil
import subprocess

from healthd.cluster.base import ClusterBackend
from healthd.config import Settings
from healthd.errors import ConfigError
from healthd.logging import get_logger

log = get_logger(__name__)

__all__ = ["ClusterBackend", "make_backend", "slurm_answers"]


def slurm_answers(settings: Settings, timeout_s: float = 10.0) -> bool:
    """True when ``sinfo`` exists and reaches a controller (used by ``backend = "auto"``)."""
    bin_dir = settings.slurm.bin_dir
    sinfo = str(bin_dir / "sinfo") if bin_dir else shutil.which("sinfo")
    if not sinfo:
        return False
    try:
        done = subprocess.run(
            [sinfo, "-h", "-o", "%n"], capture_output=True, timeout=timeout_s, start_new_session=True, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def make_backend(settings: Settings, *, runs_probes: bool = True) -> ClusterBackend:
    """The configured backend; ``runs_probes``: refuse a local backend whose ``local.python`` lacks torch.

    :raises ConfigError: the backend cannot work as configured.
    """
    kind = settings.backend
    if kind == "auto":
        kind = "slurm" if slurm_answers(settings) else "local"
        log.info("backend_chosen", backend=kind, why="sinfo answered" if kind == "slurm" else "no Slurm answered")
    if kind == "local":
        from healthd.cluster.local import LocalBackend, require_probe_python

        if runs_probes:
            chosen = ("backend = 'auto' found no Slurm answering (sinfo), so the local backend"
                      if settings.backend == "auto" else "backend = 'local'")
            require_probe_python(settings.local.python, f"{chosen} runs the probes on this machine")
        return LocalBackend(
            node_name=settings.local.node_name, python=settings.local.python, ranks=settings.local.ranks,
            gpus=settings.local.gpus, node_class=settings.local.node_class,
        )
    try:
        from healthd.cluster.slurm import SlurmBackend  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ConfigError(f"backend = 'slurm' is not available in this build: {exc}") from None
    backend: ClusterBackend = SlurmBackend.from_settings(settings)
    return backend
