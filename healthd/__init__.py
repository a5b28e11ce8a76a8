"""healthd: a continuous health monitor for Slurm GPU clusters."""

__version__ = "0.1.0"
