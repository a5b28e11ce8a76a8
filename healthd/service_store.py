"""One store for the CLI and the service: which store a command opens, as whom, and how.

On an admin node where the service's config is installed (``healthd.config.service_config_path``),
every command reads it and so uses the service's ``state_dir`` whoever runs it. Here:

- a command that only reads opens the store read-only (SQLite ``mode=ro``): it never migrates it and
  never writes it; SQLite gives the ``-wal``/``-shm`` files a read-only opener may create as root the
  database file's owner, so no file owned by another user is left behind; a reader who may not write
  the directory (a member of the service's group) reads a stopped service's store as it is
  (``healthd.store.db.Database``);
- a command that writes runs as the service's user (``[service] user``, else the owner of the
  store's directory): root runs it again as that user, anyone else is refused with the command to
  type instead;
- a command that would create a new store while the service's config is installed, in a place the
  service does not read, is refused and names the service's store.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from healthd.config import Settings, is_service_config, load_settings, service_config_path
from healthd.errors import ConfigError, HealthdError, StoreError

if TYPE_CHECKING:
    from healthd.store import Store


@dataclass(frozen=True)
class ServiceUser:
    """The user the service runs as, and where healthd learnt it."""

    name: str
    uid: int
    gid: int
    source: str


def service_user(settings: Settings) -> ServiceUser | None:
    """``[service] user``, else the owner of the store's directory (else of ``state_dir``); ``None``
    when neither is known (nothing created yet and no user configured).

    :raises ConfigError: ``[service] user`` names no user of this machine.
    """
    if settings.service.user:
        try:
            entry = pwd.getpwnam(settings.service.user)
        except KeyError:
            raise ConfigError(f"[service] user {settings.service.user!r} is no user of this machine") from None
        return ServiceUser(entry.pw_name, entry.pw_uid, entry.pw_gid, "[service] user")
    for directory in (settings.store_path.parent, settings.state_dir):
        try:
            st = directory.stat()
        except OSError:
            continue
        try:
            name = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            name = str(st.st_uid)
        return ServiceUser(name, st.st_uid, st.st_gid, f"the owner of {directory}")
    return None


def service_store_path() -> Path | None:
    """The store the service uses, read from its config; ``None`` where no service config is
    installed or it cannot be read (``check-config`` says why)."""
    path = service_config_path()
    if not path.exists():
        return None
    try:
        settings, _ = load_settings(path)
    except ConfigError:
        return None
    return settings.store_path


def _refuse_new_store(path: Path, config_path: Path | None) -> None:
    """Refuse to create ``path`` when it is not the store the installed service reads."""
    if is_service_config(config_path):
        raise HealthdError(f"the service's store {path} does not exist yet: start the service first "
                           "(systemctl start healthd), it creates the store; this command does not")
    service = service_store_path()
    if service is not None and service != path:
        raise HealthdError(f"refused to create {path}: no service reads it; the service's store is {service} "
                           f"(its config is {service_config_path()}): drop --config/$HEALTHD_CONFIG to use it")


def become(user: ServiceUser, argv: Sequence[str] | None) -> None:
    """Run the rest of the command (root) as ``user``: the command again, ``healthd ARGV``, in a fresh
    process as that user (``setpriv``, where it and ``argv`` are there), else this process switched for
    good to its groups, its gid, its uid. A fresh process imports from the start as that user: a switch
    in the middle leaves modules still to import that the user may not read."""
    setpriv = shutil.which("setpriv")
    if argv is not None and setpriv is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(setpriv, [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups",
                           sys.executable, "-m", "healthd.cli", *argv])
    try:
        os.initgroups(user.name, user.gid)
    except (OSError, KeyError):
        os.setgroups([user.gid])
    os.setgid(user.gid)
    os.setuid(user.uid)


def open_store(settings: Settings, config_path: Path | None, *, write: bool, command: str,
               argv: Sequence[str] | None = None) -> Store:
    """The store ``command`` works on, opened as described in this module; ``argv``: the command line's
    arguments, to run it again as the service's user (``become``).

    :raises HealthdError: no store (and none may be created here), or it belongs to the service's
        user and this caller may not act as that user; the message says what to do.
    """
    from healthd.store import Store

    path = settings.store_path
    if not path.exists():
        if not write:
            hint = ("is the service running? (systemctl status healthd)" if is_service_config(config_path)
                    else "has the daemon run with this config?")
            raise HealthdError(f"no state store at {path}: {hint}")
        _refuse_new_store(path, config_path)
    elif not is_service_config(config_path) and (service := service_store_path()) not in (None, path):
        print(f"healthd: note: {path} is not the service's store ({service})", file=sys.stderr)
    user = service_user(settings) if write else None
    euid = os.geteuid()
    if user is not None and user.uid != euid:
        if euid != 0:
            raise HealthdError(
                f"{path} belongs to the service's user {user.name} ({user.source}); a command that writes it "
                f"runs as that user: sudo -u {shlex.quote(user.name)} healthd {command} ... (or as root)")
        become(user, argv)
    try:
        return Store(path, read_only=not write)
    except StoreError as exc:
        if write or euid == 0 or os.access(path, os.R_OK):
            raise
        owner = service_user(settings)
        who = f"as the service's user ({owner.name}) or " if owner else ""
        raise HealthdError(f"{exc}: run it {who}as root") from None
