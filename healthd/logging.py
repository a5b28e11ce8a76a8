"""structlog setup: JSON lines when stdout is not a terminal, console output when it is.

Third-party stdlib logs (APScheduler) go through the same renderer. Code that works on one
probe run binds ``node``, ``probe`` and ``run_id`` with ``structlog.contextvars.bound_contextvars``
so every line it logs carries them.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(
    level: Literal["debug", "info", "warning", "error"] = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
) -> None:
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if use_console:
        renderer = structlog.dev.ConsoleRenderer()
    else:
        shared.append(structlog.processors.dict_tracebacks)
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    logging.getLogger("apscheduler").setLevel(max(_LEVELS[level], logging.WARNING))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)
