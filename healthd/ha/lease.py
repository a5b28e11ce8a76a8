"""The lease and the action journal on MariaDB/MySQL: healthd's one I/O module for HA.

Contract:

- Leadership is one row of ``healthd_lease``, taken or renewed by single ``UPDATE`` statements (never a
  transaction held open across a round trip: a paused holder must not keep the row locked); its expiry is
  ``NOW(6) + INTERVAL ttl``, always on the database's clock, so the admin nodes' clocks do not matter.
  ``GET_LOCK`` is not used (unsupported on Galera, silently released after ``wait_timeout``, stacked per
  connection). Each change of holder, or a lease taken again after it expired, increments ``epoch``.
- An instance leads while its last successful renewal started less than ``lease_ttl_s / 2`` ago on its
  own monotonic clock (:meth:`Lease.leading`), and each action is recorded first by :meth:`Lease.record`:
  an ``INSERT … SELECT`` that inserts a row only while this instance holds the current epoch with
  ``fence_margin_s`` left on the lease. No row: the action must not be taken, and the instance steps down.
- A schema newer than :data:`SCHEMA_VERSION` or older (not upgraded by ``healthd ha init``) is refused, and
  so is a server with ``read_only`` set.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from healthd.config import HaSettings
from healthd.errors import ConfigError, HaError
from healthd.logging import get_logger

log = get_logger("healthd.ha")

SCHEMA_VERSION = 2
"""The schema this healthd writes and reads; ``healthd ha init`` upgrades an older one to it (1 -> 2: the run
registry, ``healthd_runs``)."""
LEASE_NAME = "leader"
MAX_DETAIL = 1000

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS healthd_meta (
        name VARCHAR(64) NOT NULL PRIMARY KEY,
        value VARCHAR(255) NOT NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS healthd_lease (
        name VARCHAR(64) NOT NULL PRIMARY KEY,
        holder VARCHAR(128) NOT NULL,
        epoch BIGINT NOT NULL,
        since DATETIME(6) NOT NULL,
        expires_at DATETIME(6) NOT NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS healthd_actions (
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        at DATETIME(6) NOT NULL,
        epoch BIGINT NOT NULL,
        holder VARCHAR(128) NOT NULL,
        verb VARCHAR(32) NOT NULL,
        nodes VARCHAR(4096) NOT NULL,
        probe VARCHAR(255) NOT NULL,
        detail VARCHAR(1024) NOT NULL,
        INDEX healthd_actions_verb_at (verb, at)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS healthd_runs (
        run_id VARCHAR(128) NOT NULL PRIMARY KEY,
        holder VARCHAR(128) NOT NULL,
        epoch BIGINT NOT NULL,
        job_id VARCHAR(64) NOT NULL,
        probe VARCHAR(255) NOT NULL,
        nodes VARCHAR(4096) NOT NULL,
        kind VARCHAR(32) NOT NULL,
        result_path VARCHAR(1024) NOT NULL,
        submitted_at DOUBLE NOT NULL,
        done TINYINT NOT NULL DEFAULT 0,
        INDEX healthd_runs_done (done)
    ) ENGINE=InnoDB""",
)


class _Cursor(Protocol):
    rowcount: int

    def execute(self, query: str, args: Any = None) -> int: ...

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> tuple[tuple[Any, ...], ...]: ...

    def close(self) -> None: ...


class Connection(Protocol):
    def cursor(self) -> _Cursor: ...

    def begin(self) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """Where the database is: from ``ha.url`` and ``ha.password_file``."""

    user: str
    host: str
    port: int
    database: str
    password: str


@dataclass(frozen=True)
class SharedRun:
    """A submitted probe run in the run registry (``healthd_runs``): what a new leader needs to collect it."""

    run_id: str
    probe: str
    nodes: tuple[str, ...]
    kind: str
    job_id: str
    result_path: str
    submitted_at: float


@dataclass(frozen=True)
class JournalDrain:
    """A drain in the action journal: which instance made it, when (Unix time, the database's clock)."""

    node: str
    holder: str
    epoch: int
    at: float
    reason: str


@dataclass(frozen=True)
class LeaseRow:
    """The lease as the database has it: ``live`` is ``expires_at > NOW(6)`` on the database's clock."""

    holder: str
    epoch: int
    since: str
    expires_at: str
    live: bool


def read_password(path: Path) -> str:
    """The password in ``path`` (its first line).

    :raises ConfigError: unreadable, or readable by others than its owner (group or other bits set).
    """
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"ha.password_file {path}: cannot read it: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"ha.password_file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it; "
                          "it must be readable by the service's user only (chmod 0600)")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"ha.password_file {path}: owned by uid {st.st_uid}, not by the service's user "
                          f"(uid {os.geteuid()})")
    return text.splitlines()[0] if text else ""


def target(settings: HaSettings) -> Target:
    """The connection target of ``settings`` (``mode = "mariadb"``).

    :raises ConfigError: no url or password file, or a password file others can read.
    """
    if settings.url is None or settings.password_file is None:
        raise ConfigError("ha.mode = 'mariadb' needs ha.url and ha.password_file")
    parts = urlsplit(settings.url)
    return Target(user=parts.username or "", host=parts.hostname or "", port=parts.port or 3306,
                  database=parts.path.lstrip("/"), password=read_password(settings.password_file))


def connect(t: Target, timeout_s: float) -> Connection:
    """A PyMySQL connection to ``t`` (``healthd[ha]``), every call bounded by ``timeout_s``.

    :raises HaError: PyMySQL is not installed, or the server does not answer.
    """
    try:
        import pymysql
    except ImportError:
        raise HaError("ha.mode = 'mariadb' needs PyMySQL: pip install 'healthd[ha]'") from None
    t_int = max(1, round(timeout_s))
    try:
        conn: Connection = pymysql.connect(
            host=t.host, port=t.port, user=t.user, password=t.password, database=t.database,
            connect_timeout=t_int, read_timeout=t_int, write_timeout=t_int, autocommit=True, charset="utf8mb4",
            init_command=f"SET SESSION innodb_lock_wait_timeout = {t_int}")
    except pymysql.MySQLError as exc:
        raise HaError(f"cannot connect to {t.user}@{t.host}:{t.port}/{t.database}: {exc}") from None
    return conn


def _micro(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


class Lease:
    """This instance's side of the lease: renew, lead, record actions. Thread-safe (one connection, one lock).

    :param connector: opens a connection (``connect`` with the settings' target); called again after an error.
    :param clock: the monotonic clock (tests pass their own).
    """

    def __init__(self, settings: HaSettings, connector: Callable[[], Connection] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.instance = settings.instance_id
        if connector is None:
            t = target(settings)

            def connector() -> Connection:
                return connect(t, settings.timeout_s)

        self._connector = connector
        self._clock = clock
        self._conn: Connection | None = None
        self._io = threading.RLock()
        """Held for each database call (one connection); never while ``_lock`` is wanted for long."""
        self._lock = threading.RLock()
        """Guards the state below; never held across a database call, so ``leading`` never waits on one."""
        self.epoch: int | None = None
        """The epoch this instance leads under, ``None`` while it does not lead."""
        self.since: str | None = None
        self._renewed_at = float("-inf")
        self.last_error: str | None = None
        self.transitions = 0
        """How many times this instance became leader."""
        self.seen: LeaseRow | None = None
        """The lease as the last renewal found it."""
        self._last_epoch = -1
        """The last epoch this process led under (-1: none): only that term may be taken again before it expires."""

    # -- connection -----------------------------------------------------------------------------
    @contextmanager
    def _cursor(self) -> Iterator[_Cursor]:
        """A cursor on a checked connection; an error drops the connection (the next call reconnects)."""
        import pymysql

        with self._io:
            try:
                if self._conn is None:
                    conn = self._connector()
                    try:
                        check_server(conn)
                    except BaseException:
                        conn.close()
                        raise
                    self._conn = conn
                cur = self._conn.cursor()
                try:
                    yield cur
                finally:
                    cur.close()
            except pymysql.MySQLError as exc:
                self._drop()
                raise HaError(f"database: {exc}") from None
            except HaError:
                self._drop()
                raise

    def _drop(self) -> None:
        if self._conn is not None:
            with suppress(Exception):  # a connection already broken
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._io:
            self._drop()

    # -- leadership -----------------------------------------------------------------------------
    def leading(self) -> bool:
        """Whether this instance may act now: it holds an epoch and renewed it less than half a TTL ago."""
        with self._lock:
            if self.epoch is None:
                return False
            if self._clock() - self._renewed_at >= self.settings.lease_ttl_s / 2:
                self._step_down("no renewal for half the lease")
                return False
            return True

    def _step_down(self, why: str) -> None:
        if self.epoch is not None:
            log.warning("ha_step_down", instance=self.instance, epoch=self.epoch, why=why)
        self.epoch = None
        self.since = None

    def renew(self) -> LeaseRow | None:
        """Take the lease if it is free or expired, or renew it if held; the lease as it is now, ``None``
        when the database did not answer (this instance then does not lead)."""
        started = self._clock()
        ttl = _micro(self.settings.lease_ttl_s)
        with self._lock:
            mine = self.epoch
        try:
            with self._cursor() as cur:
                # Single statements, each atomic on the server: no row lock is ever held across a round trip, so
                # a paused process (SIGSTOP, a frozen VM) holding the lease cannot block the others' takeover.
                if mine is not None:
                    cur.execute("UPDATE healthd_lease SET expires_at = NOW(6) + INTERVAL %s MICROSECOND "
                                "WHERE name = %s AND holder = %s AND epoch = %s AND expires_at > NOW(6)",
                                (ttl, LEASE_NAME, self.instance, mine))
                # free, expired, or this process's own last term (it stepped down by its clock): a new term, a new
                # epoch. A term under this instance_id that another process took (a restart, a copied config)
                # is waited out like anyone's: its last Slurm call may still be under way.
                cur.execute("UPDATE healthd_lease SET holder = %s, epoch = epoch + 1, since = NOW(6), "
                            "expires_at = NOW(6) + INTERVAL %s MICROSECOND WHERE name = %s AND "
                            "(expires_at <= NOW(6) OR (holder = %s AND epoch = %s))",
                            (self.instance, ttl, LEASE_NAME, self.instance, self._last_epoch if mine is None else -1))
                new_term = cur.rowcount == 1  # the epoch changed: reliable with or without CLIENT_FOUND_ROWS
                cur.execute("SELECT holder, epoch, since, expires_at, expires_at > NOW(6) FROM healthd_lease "
                            "WHERE name = %s", (LEASE_NAME,))
                now_row = cur.fetchone()
                if now_row is None:
                    raise HaError("healthd_lease has no lease row: run `healthd ha init`")
                took = new_term or (str(now_row[0]) == self.instance and int(now_row[1]) == mine
                                    and bool(now_row[4]))
        except HaError as exc:
            with self._lock:
                self._step_down(f"database: {exc}")
                if str(exc) != self.last_error:
                    log.error("ha_database_error", instance=self.instance, error=str(exc))
                self.last_error = str(exc)
            return None
        assert now_row is not None
        lease = LeaseRow(str(now_row[0]), int(now_row[1]), str(now_row[2]), str(now_row[3]), bool(now_row[4]))
        with self._lock:
            self.seen = lease
            if self.last_error is not None:
                log.warning("ha_database_back", instance=self.instance)
            self.last_error = None
            if lease.holder == self.instance and lease.live and not took:
                # the lease names this instance under an epoch it did not take: another process uses the
                # same instance_id (a copied config), or this instance's process before a restart; never lead on a
                # term this process did not start
                log.error("ha_instance_id_in_use", instance=self.instance, epoch=lease.epoch,
                          why="a term under this instance_id that this process did not take: another process "
                              "with the same instance_id (give each its own), or this instance before a restart "
                              "(waited out until it expires)")
                self._step_down(f"another process holds epoch {lease.epoch} under instance_id {self.instance}")
            elif lease.holder == self.instance and lease.live:
                if self.epoch != lease.epoch:
                    self.transitions += 1
                    log.warning("ha_leader", instance=self.instance, epoch=lease.epoch, since=lease.since)
                self.epoch, self.since, self._renewed_at = lease.epoch, lease.since, started
                self._last_epoch = lease.epoch
            else:
                self._step_down(f"{lease.holder} holds epoch {lease.epoch}")
        return lease

    def describe(self) -> str:
        """One line for ``/healthz``: leading (epoch, since when), or standby and who leads, or why no one."""
        with self._lock:
            if self.leading():
                return f"ha: {self.instance} leads, epoch {self.epoch}, since {self.since} (database clock)"
            if self.last_error is not None:
                return f"ha: {self.instance} is standby: {self.last_error}"
            seen = self.seen
            if seen is not None and seen.live and seen.holder != self.instance:
                return f"ha: {self.instance} is standby; {seen.holder} leads, epoch {seen.epoch}, since {seen.since}"
            return f"ha: {self.instance} is standby; no leader seen yet"

    def release(self) -> None:
        """Give the lease up now (a clean stop): the standby takes over at its next renewal."""
        with self._lock:
            epoch = self.epoch
            self._step_down("stopping")
        if epoch is None:
            return
        try:
            with self._cursor() as cur:
                cur.execute("UPDATE healthd_lease SET expires_at = NOW(6) WHERE name = %s AND holder = %s "
                            "AND epoch = %s", (LEASE_NAME, self.instance, epoch))
        except HaError as exc:
            log.warning("ha_release_failed", instance=self.instance, error=str(exc))

    # -- the fenced journal ---------------------------------------------------------------------
    def record(self, verb: str, nodes: tuple[str, ...] = (), probe: str = "", detail: str = "") -> int | None:
        """Record an action about to be taken; its epoch, or ``None`` when it must not be taken (this instance
        does not lead, or the database refused the row: then it steps down)."""
        with self._lock:
            if not self.leading():
                return None
            epoch = self.epoch
        why = None
        try:
            with self._cursor() as cur:
                cur.execute(
                    "INSERT INTO healthd_actions (at, epoch, holder, verb, nodes, probe, detail) "
                    "SELECT NOW(6), %s, %s, %s, %s, %s, %s FROM healthd_lease "
                    "WHERE name = %s AND holder = %s AND epoch = %s "
                    "AND expires_at > NOW(6) + INTERVAL %s MICROSECOND",
                    (epoch, self.instance, verb, ",".join(nodes)[:4096], probe[:255], detail[:MAX_DETAIL],
                     LEASE_NAME, self.instance, epoch, _micro(self.settings.fence_margin_s)))
                if cur.rowcount != 1:
                    why = f"the journal refused {verb} under epoch {epoch}"
        except HaError as exc:
            why = f"journal: {exc}"
        if why is None:
            return epoch
        with self._lock:
            if self.epoch == epoch:
                self._step_down(why)
        return None

    def launches(self, since_s: float) -> dict[tuple[str, str], float]:
        """``(node, probe) → last submission time`` (Unix time) journalled by any instance in the last
        ``since_s`` seconds: a new leader goes on with the schedule instead of probing everything at once."""
        with self._cursor() as cur:
            cur.execute("SELECT nodes, probe, UNIX_TIMESTAMP(MAX(at)) FROM healthd_actions WHERE verb = 'submit' "
                        "AND at > NOW(6) - INTERVAL %s MICROSECOND GROUP BY nodes, probe", (_micro(since_s),))
            rows = cur.fetchall()
        out: dict[tuple[str, str], float] = {}
        for nodes, probe, at in rows:
            for node in str(nodes).split(","):
                for name in str(probe).split(","):
                    if node and name and float(at) > out.get((node, name), float("-inf")):
                        out[(node, name)] = float(at)
        return out

    def register_runs(self, runs: Sequence[SharedRun]) -> None:
        """Put submitted runs in the run registry, under this instance's epoch (a run already there is kept)."""
        if not runs:
            return
        with self._lock:
            epoch = self.epoch or 0
        with self._cursor() as cur:
            for r in runs:
                cur.execute("INSERT IGNORE INTO healthd_runs (run_id, holder, epoch, job_id, probe, nodes, kind, "
                            "result_path, submitted_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            (r.run_id, self.instance, epoch, r.job_id, r.probe, ",".join(r.nodes), r.kind,
                             r.result_path, r.submitted_at))

    def open_runs(self) -> list[SharedRun]:
        """The runs in the registry not closed yet (by any instance), oldest first."""
        with self._cursor() as cur:
            cur.execute("SELECT run_id, probe, nodes, kind, job_id, result_path, submitted_at FROM healthd_runs "
                        "WHERE done = 0 ORDER BY submitted_at")
            rows = cur.fetchall()
        return [SharedRun(str(r[0]), str(r[1]), tuple(n for n in str(r[2]).split(",") if n), str(r[3]), str(r[4]),
                          str(r[5]), float(r[6])) for r in rows]

    def close_runs(self, run_ids: Sequence[str]) -> None:
        """Mark runs collected in the registry (kept for the record; ``prune_runs`` deletes old ones)."""
        if not run_ids:
            return
        with self._cursor() as cur:
            cur.execute(f"UPDATE healthd_runs SET done = 1 WHERE run_id IN ({', '.join(['%s'] * len(run_ids))})",
                        tuple(run_ids))

    def journal_drains(self, since_s: float, *, others_only: bool = True) -> list[JournalDrain]:
        """The drains journalled in the last ``since_s`` seconds (with ``others_only``, by other instances):
        the breaker window and the hourly cap count them, so a failover does not grant a second quota."""
        with self._cursor() as cur:
            cur.execute("SELECT nodes, holder, epoch, UNIX_TIMESTAMP(at), detail FROM healthd_actions "
                        "WHERE verb = 'drain' AND at > NOW(6) - INTERVAL %s MICROSECOND"
                        + (" AND holder <> %s" if others_only else "") + " ORDER BY id",
                        (_micro(since_s), self.instance) if others_only else (_micro(since_s),))
            rows = cur.fetchall()
        return [JournalDrain(str(r[0]), str(r[1]), int(r[2]), float(r[3]), str(r[4])) for r in rows]

    def drains(self, nodes: Sequence[str], verbs: Sequence[str]) -> dict[str, set[int]]:
        """The epochs under which each of ``nodes`` was recorded with one of ``verbs`` (any instance)."""
        if not nodes or not verbs:
            return {}
        with self._cursor() as cur:
            cur.execute(f"SELECT nodes, epoch FROM healthd_actions WHERE verb IN ({', '.join(['%s'] * len(verbs))}) "
                        f"AND nodes IN ({', '.join(['%s'] * len(nodes))})", (*verbs, *nodes))
            rows = cur.fetchall()
        out: dict[str, set[int]] = {}
        for node, epoch in rows:
            out.setdefault(str(node), set()).add(int(epoch))
        return out

    def status(self) -> LeaseRow:
        """The lease as the database has it now."""
        with self._cursor() as cur:
            return lease_row(cur)


def lease_row(cur: _Cursor) -> LeaseRow:
    cur.execute("SELECT holder, epoch, since, expires_at, expires_at > NOW(6) FROM healthd_lease WHERE name = %s",
                (LEASE_NAME,))
    row = cur.fetchone()
    if row is None:
        raise HaError("healthd_lease has no lease row: run `healthd ha init`")
    return LeaseRow(str(row[0]), int(row[1]), str(row[2]), str(row[3]), bool(row[4]))


def read_lease(settings: HaSettings) -> LeaseRow:
    """The lease row as the database sees it now (one connection: server and schema checked, row read, closed).

    :raises HaError: the database does not answer, refuses (``check_server``) or has no lease row.
    """
    conn = connect(target(settings), settings.timeout_s)
    try:
        check_server(conn)
        cur = conn.cursor()
        try:
            return lease_row(cur)
        finally:
            cur.close()
    finally:
        conn.close()


def check_server(conn: Connection, *, schema: bool = True) -> None:
    """Refuse a server with ``read_only`` set, and (``schema``) a schema other than :data:`SCHEMA_VERSION`.

    :raises HaError: with what is wrong and what to do.
    """
    cur = conn.cursor()
    try:
        cur.execute("SELECT @@global.read_only")
        row = cur.fetchone()
        if row is not None and int(row[0]):
            raise HaError("the database server has read_only set (a replica, or not Galera's primary): "
                          "healthd needs the writable primary")
        if not schema:
            return
        try:
            cur.execute("SELECT value FROM healthd_meta WHERE name = 'schema_version'")
            row = cur.fetchone()
        except Exception as exc:
            raise HaError(f"no healthd schema in this database ({exc}): run `healthd ha init`") from None
        version = int(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise HaError(f"the database's healthd schema is version {version}, newer than this healthd knows "
                          f"({SCHEMA_VERSION}): upgrade this healthd")
        if version < SCHEMA_VERSION:
            raise HaError(f"the database's healthd schema is version {version}: run `healthd ha init` to upgrade "
                          f"it to {SCHEMA_VERSION}")
    finally:
        cur.close()


def init_schema(conn: Connection) -> int:
    """Create the schema, or upgrade it to :data:`SCHEMA_VERSION`; idempotent. The version found before
    (0: none).

    :raises HaError: a read-only server, or a schema newer than this healthd knows.
    """
    check_server(conn, schema=False)
    cur = conn.cursor()
    try:
        for ddl in _SCHEMA[:1]:
            cur.execute(ddl)
        cur.execute("SELECT value FROM healthd_meta WHERE name = 'schema_version'")
        row = cur.fetchone()
        before = int(row[0]) if row is not None else 0
        if before > SCHEMA_VERSION:
            raise HaError(f"the database's healthd schema is version {before}, newer than this healthd knows "
                          f"({SCHEMA_VERSION}): upgrade this healthd, not the schema")
        for ddl in _SCHEMA[1:]:
            cur.execute(ddl)
        cur.execute("INSERT IGNORE INTO healthd_lease (name, holder, epoch, since, expires_at) "
                    "VALUES (%s, '', 0, NOW(6), NOW(6))", (LEASE_NAME,))
        cur.execute("INSERT INTO healthd_meta (name, value) VALUES ('schema_version', %s) "
                    "ON DUPLICATE KEY UPDATE value = VALUES(value)", (str(SCHEMA_VERSION),))
        return before
    finally:
        cur.close()
