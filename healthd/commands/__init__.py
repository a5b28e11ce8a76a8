"""Subcommands of ``healthd``: one module per command (or family), each with ``register(subparsers)``.

``healthd.cli`` discovers every module here; a module's ``register`` adds its parser(s) and sets
``func`` to a handler ``(args) -> int``. Shared helpers live in ``healthd.commands.common``.
"""
