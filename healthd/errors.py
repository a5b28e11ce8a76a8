"""The exception hierarchy of healthd.

Raise the specific error at the boundary where it happens; catch ``HealthdError`` at a
scheduler tick, log it once with context, count it and carry on. ``ConfigError`` stops
start-up.
"""

from __future__ import annotations


class HealthdError(Exception):
    """Root of every error healthd raises on purpose."""


class ConfigError(HealthdError):
    """The configuration is invalid. ``str(err)`` names the file, the key and the problem."""


class StoreError(HealthdError):
    """The SQLite store cannot be opened, migrated or written."""


class StoreUnavailable(StoreError):
    """The store cannot be written now (disk full, locked by another process, I/O error); the change
    was rolled back and the same write may succeed later."""


class BackendError(HealthdError):
    """A cluster backend could not do what was asked (infrastructure, never the node's fault)."""


class SlurmError(BackendError):
    """A Slurm command failed or printed something we cannot read."""


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer within its timeout."""


class CommandTimeout(HealthdError):
    """A subprocess ran past its timeout and was killed with its process group."""


class ParseError(HealthdError):
    """Text (probe output, tool output) could not be read into a typed result.

    The message says what was expected and where (line number when there is one).
    """


class InvalidNodeName(HealthdError):
    """A string that is not a valid node name (or hostlist expression) was given."""


class PolicyRefused(HealthdError):
    """Remediation refused an action (ownership, circuit breaker, cap); the reason is the message."""


class TopologyError(ParseError):
    """A topology (Slurm's answer or a topology file) that cannot be used: unreadable, a node under two
    leaves, a loop. The daemon goes on without topology and says so; never a node's fault."""


class HaError(HealthdError):
    """The HA database (``[ha]``) cannot be used: unreachable, ``read_only``, or a schema this healthd does not know."""


class ImageError(HealthdError):
    """The probe image could not be built, or an image lacks what ``python -m probes`` needs."""
