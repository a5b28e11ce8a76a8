"""The store's schema: forward migrations keyed on ``PRAGMA user_version``.

A migration is appended, never edited: a store written by an older healthd is brought forward at
open, one migration per transaction; a store newer than this healthd is refused.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from healthd.errors import StoreError

MIGRATIONS: tuple[str, ...] = (
    # 1: initial schema
    """
    CREATE TABLE runs (
        run_id       TEXT PRIMARY KEY,
        probe        TEXT NOT NULL,
        backend      TEXT NOT NULL,
        job_id       TEXT,
        state        TEXT NOT NULL CHECK (state IN ('submitted', 'running', 'finished')),
        outcome      TEXT CHECK (outcome IN ('pass', 'degraded', 'fail', 'error', 'skipped')),
        reason       TEXT NOT NULL DEFAULT '',
        submitted_at REAL NOT NULL,
        started_at   REAL,
        finished_at  REAL,
        duration_s   REAL,
        result_path  TEXT,
        source       TEXT NOT NULL DEFAULT 'probe'
    );
    CREATE INDEX runs_state ON runs (state);
    CREATE TABLE run_nodes (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        node   TEXT NOT NULL,
        PRIMARY KEY (run_id, node)
    );
    CREATE INDEX run_nodes_node ON run_nodes (node);
    CREATE TABLE measurements (
        id       INTEGER PRIMARY KEY,
        run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        probe    TEXT NOT NULL,
        node     TEXT,
        name     TEXT NOT NULL,
        labels   TEXT NOT NULL,
        value    REAL NOT NULL,
        per_rank TEXT,
        at       REAL NOT NULL
    );
    CREATE INDEX measurements_series ON measurements (probe, name, node, labels, at);
    CREATE INDEX measurements_run ON measurements (run_id);
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        name   TEXT NOT NULL,
        ok     INTEGER NOT NULL,
        detail TEXT NOT NULL,
        node   TEXT,
        gpu    INTEGER,
        rank   INTEGER
    );
    CREATE INDEX checks_run ON checks (run_id);
    CREATE TABLE verdicts (
        id          INTEGER PRIMARY KEY,
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        reason      TEXT NOT NULL,
        reason_code TEXT NOT NULL,
        run_ids     TEXT NOT NULL,
        evidence    TEXT NOT NULL,
        at          REAL NOT NULL
    );
    CREATE INDEX verdicts_node_probe ON verdicts (node, probe, at);
    CREATE TABLE nodes (
        name        TEXT PRIMARY KEY,
        state       TEXT NOT NULL,
        flags       TEXT NOT NULL,
        partitions  TEXT NOT NULL,
        gpus        INTEGER NOT NULL,
        gpu_type    TEXT,
        features    TEXT NOT NULL,
        reason      TEXT,
        node_class  TEXT,
        last_seen   REAL NOT NULL
    );
    CREATE TABLE counters (
        name   TEXT NOT NULL,
        labels TEXT NOT NULL,
        value  REAL NOT NULL,
        PRIMARY KEY (name, labels)
    );
    """,
    # 2: judgement state, recommendations, remediation audit and drain history
    """
    CREATE TABLE judge_series (
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        name        TEXT NOT NULL,
        labels      TEXT NOT NULL,
        accepted    TEXT NOT NULL,
        last_value  REAL,
        last_at     REAL NOT NULL,
        last_run_id TEXT NOT NULL,
        floor       REAL,
        baseline    REAL,
        spread      REAL,
        PRIMARY KEY (node, probe, name, labels)
    );
    CREATE TABLE judge_marks (
        run_id      TEXT NOT NULL,
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        at          REAL NOT NULL,
        severity    INTEGER NOT NULL,
        code        TEXT NOT NULL,
        text        TEXT NOT NULL,
        regular     INTEGER NOT NULL,
        event_proof INTEGER NOT NULL,
        raw_flagged INTEGER NOT NULL,
        findings    TEXT NOT NULL,
        PRIMARY KEY (run_id, node)
    );
    CREATE INDEX judge_marks_node ON judge_marks (node, at);
    CREATE INDEX judge_marks_at ON judge_marks (at);
    CREATE TABLE judge_groups (
        run_id      TEXT PRIMARY KEY,
        probe       TEXT NOT NULL,
        at          REAL NOT NULL,
        members     TEXT NOT NULL,
        suspects    TEXT NOT NULL,
        severity    INTEGER NOT NULL,
        code        TEXT NOT NULL,
        text        TEXT NOT NULL,
        event_proof INTEGER NOT NULL,
        findings    TEXT NOT NULL
    );
    CREATE INDEX judge_groups_at ON judge_groups (at);
    CREATE TABLE judge_requests (
        node         TEXT NOT NULL,
        probe        TEXT NOT NULL,
        kind         TEXT NOT NULL,
        nodes        TEXT NOT NULL,
        requested_at REAL NOT NULL,
        reason       TEXT NOT NULL,
        PRIMARY KEY (node, probe)
    );
    CREATE TABLE fleet_events (
        id          INTEGER PRIMARY KEY,
        node_class  TEXT NOT NULL,
        probe       TEXT NOT NULL,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        flagged     INTEGER NOT NULL,
        sampled     INTEGER NOT NULL,
        series      TEXT NOT NULL,
        text        TEXT NOT NULL
    );
    CREATE UNIQUE INDEX fleet_events_active ON fleet_events (node_class, probe) WHERE ended_at IS NULL;
    CREATE TABLE recommendations (
        id           INTEGER PRIMARY KEY,
        node         TEXT NOT NULL,
        probe        TEXT NOT NULL,
        outcome      TEXT NOT NULL,
        reason_code  TEXT NOT NULL,
        text         TEXT NOT NULL,
        evidence     TEXT NOT NULL,
        since        REAL NOT NULL,
        updated_at   REAL NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('active', 'cleared', 'withdrawn', 'dismissed')),
        closed_at    REAL,
        close_reason TEXT NOT NULL DEFAULT '',
        escalated    INTEGER NOT NULL DEFAULT 0,
        last_refusal TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX recommendations_active ON recommendations (node, probe) WHERE state = 'active';
    CREATE INDEX recommendations_node ON recommendations (node, since);
    CREATE TABLE remediation_audit (
        id      INTEGER PRIMARY KEY,
        at      REAL NOT NULL,
        actor   TEXT NOT NULL,
        action  TEXT NOT NULL,
        node    TEXT,
        result  TEXT NOT NULL CHECK (result IN ('done', 'refused', 'failed', 'info')),
        reason  TEXT NOT NULL,
        detail  TEXT NOT NULL
    );
    CREATE INDEX remediation_audit_at ON remediation_audit (at);
    CREATE TABLE drains (
        id           INTEGER PRIMARY KEY,
        node         TEXT NOT NULL,
        node_class   TEXT NOT NULL,
        reason       TEXT NOT NULL,
        actor        TEXT NOT NULL,
        automatic    INTEGER NOT NULL,
        probes       TEXT NOT NULL DEFAULT '[]',
        drained_at   REAL NOT NULL,
        undrained_at REAL,
        undrained_by TEXT
    );
    CREATE INDEX drains_node ON drains (node, drained_at);
    CREATE TABLE remediation_state (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 3: the run kind as a column (it was a run-id prefix)
    """
    ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'probe'
        CHECK (kind IN ('probe', 'reprobe', 'sweep', 'ingest'));
    UPDATE runs SET kind = 'sweep' WHERE run_id LIKE 'sw%';
    UPDATE runs SET kind = 'reprobe' WHERE run_id LIKE 'rp%';
    UPDATE runs SET kind = 'ingest' WHERE source != 'probe';
    CREATE INDEX runs_kind ON runs (kind, state)
    """,
    # 4: whether a finished run's judgement is saved (set in the judgement's transaction)
    """
    ALTER TABLE runs ADD COLUMN judged INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX runs_unjudged ON runs (judged) WHERE judged = 0
    """,
    # 5: the latest value of every (node, probe, measurement, labels) series and the latest run of every
    # (node, probe), kept in the transaction of the run's end (reads no longer scan the history)
    """
    CREATE TABLE latest (
        node   TEXT NOT NULL,
        probe  TEXT NOT NULL,
        name   TEXT NOT NULL,
        labels TEXT NOT NULL,
        value  REAL NOT NULL,
        at     REAL NOT NULL,
        run_id TEXT NOT NULL,
        seq    INTEGER NOT NULL,
        PRIMARY KEY (node, probe, name, labels)
    ) WITHOUT ROWID;
    CREATE INDEX latest_seq ON latest (seq);
    INSERT INTO latest (node, probe, name, labels, value, at, run_id, seq)
    SELECT node, probe, name, labels, value, at, run_id, 1 FROM (
        SELECT m.run_id, m.probe, COALESCE(m.node, rn.node) AS node, m.name, m.labels, m.value, m.at,
               ROW_NUMBER() OVER (PARTITION BY m.probe, COALESCE(m.node, rn.node), m.name, m.labels
                                  ORDER BY m.at DESC, m.id DESC) AS k
        FROM measurements m LEFT JOIN run_nodes rn ON m.node IS NULL AND rn.run_id = m.run_id
    ) WHERE k = 1 AND node IS NOT NULL;
    CREATE TABLE latest_runs (
        node            TEXT NOT NULL,
        probe           TEXT NOT NULL,
        run_id          TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        outcome         TEXT NOT NULL,
        reason          TEXT NOT NULL,
        submitted_at    REAL NOT NULL,
        started_at      REAL,
        finished_at     REAL NOT NULL,
        duration_s      REAL,
        last_success_at REAL,
        seq             INTEGER NOT NULL,
        PRIMARY KEY (node, probe)
    ) WITHOUT ROWID;
    CREATE INDEX latest_runs_seq ON latest_runs (seq);
    CREATE INDEX latest_runs_run ON latest_runs (run_id);
    INSERT INTO latest_runs (node, probe, run_id, outcome, reason, submitted_at, started_at, finished_at, duration_s,
                             last_success_at, seq)
    SELECT f.node, f.probe, f.run_id, f.outcome, f.reason, f.submitted_at, f.started_at, f.finished_at, f.duration_s,
           (SELECT MAX(r2.finished_at) FROM runs r2 JOIN run_nodes n2 ON n2.run_id = r2.run_id
             WHERE n2.node = f.node AND r2.probe = f.probe AND r2.outcome = 'pass'), 1
    FROM (
        SELECT n.node, r.probe, r.run_id, r.outcome, r.reason, r.submitted_at, r.started_at, r.finished_at,
               r.duration_s, ROW_NUMBER() OVER (PARTITION BY n.node, r.probe ORDER BY r.finished_at DESC) AS k
        FROM runs r JOIN run_nodes n ON n.run_id = r.run_id
        WHERE r.state = 'finished' AND r.outcome != 'skipped'
    ) f WHERE f.k = 1
    """,
    # 6: compact history: a series dictionary and one narrow row per value keyed by the run's store
    # position (runs.rowid), per-node daily rollups beyond the detail window, and when each
    # (node, probe) was last attempted (the planner's input, kept on write)
    """
    CREATE TABLE series (
        id     INTEGER PRIMARY KEY,
        probe  TEXT NOT NULL,
        node   TEXT NOT NULL,
        name   TEXT NOT NULL,
        labels TEXT NOT NULL,
        UNIQUE (probe, node, name, labels)
    );
    CREATE TABLE samples (
        run      INTEGER NOT NULL,
        series   INTEGER NOT NULL,
        value    REAL NOT NULL,
        per_rank TEXT,
        PRIMARY KEY (run, series)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO series (probe, node, name, labels)
        SELECT probe, COALESCE(node, ''), name, labels FROM measurements ORDER BY id;
    INSERT OR REPLACE INTO samples (run, series, value, per_rank)
        SELECT r.rowid, s.id, m.value, m.per_rank FROM measurements m
        JOIN runs r ON r.run_id = m.run_id
        JOIN series s ON s.probe = m.probe AND s.node = COALESCE(m.node, '') AND s.name = m.name
                     AND s.labels = m.labels;
    DROP TABLE measurements;
    CREATE VIEW measurements AS
        SELECT r.rowid * 65536 + x.series AS id, r.run_id, s.probe, NULLIF(s.node, '') AS node, s.name, s.labels,
               x.value, x.per_rank, r.finished_at AS at
        FROM samples x JOIN runs r ON r.rowid = x.run JOIN series s ON s.id = x.series;
    CREATE INDEX runs_finished ON runs (finished_at) WHERE state = 'finished';
    CREATE TABLE rollups (
        node  TEXT NOT NULL,
        probe TEXT NOT NULL,
        name   TEXT NOT NULL,
        labels TEXT NOT NULL,
        day    INTEGER NOT NULL,
        n      INTEGER NOT NULL,
        lo     REAL NOT NULL,
        mean   REAL NOT NULL,
        hi     REAL NOT NULL,
        PRIMARY KEY (node, probe, name, labels, day)
    ) WITHOUT ROWID;
    CREATE TABLE attempts (
        node         TEXT NOT NULL,
        probe        TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        PRIMARY KEY (node, probe)
    ) WITHOUT ROWID;
    INSERT INTO attempts (node, probe, submitted_at)
        SELECT n.node, r.probe, MAX(r.submitted_at) FROM runs r JOIN run_nodes n ON n.run_id = r.run_id
        WHERE r.kind != 'ingest' GROUP BY n.node, r.probe;
    CREATE TABLE store_state (
        key   TEXT PRIMARY KEY,
        value REAL NOT NULL
    )
    """,
    # 7: the judge's chance-flag counters and error streaks (they survive a restart)
    """
    CREATE TABLE judge_flag_rates (
        node_class TEXT NOT NULL,
        probe      TEXT NOT NULL,
        grouped    INTEGER NOT NULL,
        flagged    INTEGER NOT NULL,
        judged     INTEGER NOT NULL,
        PRIMARY KEY (node_class, probe, grouped)
    );
    CREATE TABLE judge_error_streaks (
        node   TEXT NOT NULL,
        probe  TEXT NOT NULL,
        streak INTEGER NOT NULL,
        PRIMARY KEY (node, probe)
    )
    """,
    # 8: on-demand probe requests (`healthd probe NAME --node N`), picked up by the daemon's plan tick
    """
    CREATE TABLE probe_requests (
        id           INTEGER PRIMARY KEY,
        probe        TEXT NOT NULL,
        node         TEXT NOT NULL,
        requested_at REAL NOT NULL,
        requested_by TEXT NOT NULL,
        state        TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'launched', 'refused', 'expired')),
        seen_at      REAL,
        settled_at   REAL,
        run_id       TEXT,
        detail       TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX probe_requests_pending ON probe_requests (state) WHERE state = 'pending'
    """,
    # 9: ``latest`` keyed by the series dictionary's id (a run's end upserts integer keys, not text); a value
    # of a multi-node group is the latest of a series of each node of its run, added to the dictionary. The
    # change marks of a row stay on it, and ``latest_nodes`` holds the newest of each node: a reader of what
    # changed walks the nodes changed, and a run's end writes one index entry per node, not one per value.
    # latest_runs keeps when a probe or re-probe last reached a verdict on the node (the coverage metrics'
    # input, read without grouping the history). And from here on judge_series.accepted holds a window as
    # packed little-endian doubles (a BLOB, 16 bytes an (at, value) pair); the JSON windows written before are
    # still read (an older healthd reads JSON only).
    """
    CREATE INDEX series_node ON series (node);
    INSERT OR IGNORE INTO series (probe, node, name, labels) SELECT probe, node, name, labels FROM latest;
    DROP INDEX latest_seq;
    ALTER TABLE latest RENAME TO latest_by_text;
    CREATE TABLE latest (
        series INTEGER PRIMARY KEY,
        value  REAL NOT NULL,
        at     REAL NOT NULL,
        run_id TEXT NOT NULL,
        seq    INTEGER NOT NULL
    );
    INSERT INTO latest (series, value, at, run_id, seq)
        SELECT s.id, l.value, l.at, l.run_id, l.seq FROM latest_by_text l
        JOIN series s ON s.probe = l.probe AND s.node = l.node AND s.name = l.name AND s.labels = l.labels;
    CREATE TABLE latest_nodes (
        node TEXT PRIMARY KEY,
        seq  INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX latest_nodes_seq ON latest_nodes (seq);
    INSERT INTO latest_nodes (node, seq) SELECT node, MAX(seq) FROM latest_by_text GROUP BY node;
    DROP TABLE latest_by_text;
    ALTER TABLE latest_runs ADD COLUMN last_judged_at REAL;
    UPDATE latest_runs SET last_judged_at = j.at FROM (
        SELECT n.node, r.probe, MAX(r.finished_at) AS at FROM runs r JOIN run_nodes n ON n.run_id = r.run_id
        WHERE r.state = 'finished' AND r.outcome IN ('pass', 'degraded', 'fail') AND r.kind IN ('probe', 'reprobe')
        GROUP BY n.node, r.probe
    ) AS j WHERE latest_runs.node = j.node AND latest_runs.probe = j.probe
    """,
    # 10: each node's GPUs as the probes last reported them (a finished run's environment): one row per GPU index,
    # kept when a later run finds fewer GPUs (``present`` 0), so a missing GPU is named by the UUID it had
    """
    CREATE TABLE gpu_inventory (
        node    TEXT NOT NULL,
        gpu     INTEGER NOT NULL,
        uuid    TEXT,
        name    TEXT,
        seen_at REAL NOT NULL,
        present INTEGER NOT NULL,
        PRIMARY KEY (node, gpu)
    ) WITHOUT ROWID
    """,
    # 11: the run kind `boundary` (node checks Slurm ran at job boundaries). SQLite cannot alter a CHECK
    # and rebuilding `runs` would cascade into every table that references it, so the CHECK is widened in
    # place (SQLite's documented writable_schema procedure for a change that leaves the stored rows valid);
    # the index is rebuilt so that every connection re-reads the schema.
    """
    PRAGMA writable_schema = ON;
    UPDATE sqlite_schema SET sql = replace(sql, 'kind IN (''probe'', ''reprobe'', ''sweep'', ''ingest'')',
        'kind IN (''probe'', ''reprobe'', ''sweep'', ''ingest'', ''boundary'')')
        WHERE type = 'table' AND name = 'runs';
    PRAGMA writable_schema = RESET;
    DROP INDEX runs_kind;
    CREATE INDEX runs_kind ON runs (kind, state)
    """,
    # 12: switch findings (healthd.judge.switches) are kept as fleet events naming a switch: its level, the
    # flagged nodes and the switches whose nodes it holds; one active finding per (switch, probe)
    """
    ALTER TABLE fleet_events ADD COLUMN switch TEXT NOT NULL DEFAULT '';
    ALTER TABLE fleet_events ADD COLUMN level INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE fleet_events ADD COLUMN nodes TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE fleet_events ADD COLUMN held TEXT NOT NULL DEFAULT '[]';
    DROP INDEX fleet_events_active;
    CREATE UNIQUE INDEX fleet_events_active ON fleet_events (node_class, probe, switch) WHERE ended_at IS NULL
    """,
    # 13: link findings (healthd.judge.links): the path between two nodes (a < b) slow on a probe while both
    # pass with other partners; one active finding per (probe, a, b), ended when the pair measures clean
    """
    CREATE TABLE link_findings (
        id         INTEGER PRIMARY KEY,
        probe      TEXT NOT NULL,
        a          TEXT NOT NULL,
        b          TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at   REAL,
        run_ids    TEXT NOT NULL,
        series     TEXT NOT NULL,
        layer      TEXT NOT NULL,
        value      REAL NOT NULL,
        reference  REAL NOT NULL,
        link       TEXT NOT NULL,
        text       TEXT NOT NULL
    );
    CREATE UNIQUE INDEX link_findings_active ON link_findings (probe, a, b) WHERE ended_at IS NULL
    """,
    # 14: the run of each (node, probe) attempt, so that the planner knows a node's last partners (rows
    # written before have none: their first round after the upgrade pairs as before)
    """
    ALTER TABLE attempts ADD COLUMN run_id TEXT
    """,
    # 15: repairs (healthd.remediation.repair): a reboot or a site's command for a node healthd drained, then
    # its full check; one open repair per node. A drain's checks count from `check_since` once a repair
    # revised it (NULL: from the drain)
    """
    CREATE TABLE repairs (
        id            INTEGER PRIMARY KEY,
        node          TEXT NOT NULL,
        kind          TEXT NOT NULL CHECK (kind IN ('reboot', 'command')),
        reason_code   TEXT NOT NULL,
        probes        TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('rebooting', 'validating', 'passed', 'failed')),
        started_at    REAL NOT NULL,
        validating_at REAL,
        ended_at      REAL,
        reason        TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX repairs_node ON repairs (node, started_at);
    CREATE UNIQUE INDEX repairs_open ON repairs (node) WHERE ended_at IS NULL;
    ALTER TABLE drains ADD COLUMN check_since REAL
    """,
    # 16: the registered cause of a fleet event other than a class event or a switch finding
    # (healthd.judge.sources: one a site or a test registers); empty for those two
    """
    ALTER TABLE fleet_events ADD COLUMN cause TEXT NOT NULL DEFAULT '';
    DROP INDEX fleet_events_active;
    CREATE UNIQUE INDEX fleet_events_active ON fleet_events (node_class, probe, switch, cause) WHERE ended_at IS NULL
    """,
    # 17: events an operator declared on a class (``healthd event start/end``): the judge holds the class's
    # flags as an event's while one is in force (healthd.judge.sources.declared)
    """
    CREATE TABLE declared_events (
        id         INTEGER PRIMARY KEY,
        node_class TEXT NOT NULL,
        reason     TEXT NOT NULL,
        started_at REAL NOT NULL,
        started_by TEXT NOT NULL,
        ended_at   REAL,
        ended_by   TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX declared_events_active ON declared_events (node_class) WHERE ended_at IS NULL
    """,
    # 18: a class event's series and scope (healthd.judge.sources.events: events keyed by class, probe and
    # series); rows from before keep '' (an event on every series of its probe, as they were judged)
    """
    ALTER TABLE fleet_events ADD COLUMN series_key TEXT NOT NULL DEFAULT '';
    ALTER TABLE fleet_events ADD COLUMN scope TEXT NOT NULL DEFAULT '';
    DROP INDEX fleet_events_active;
    CREATE UNIQUE INDEX fleet_events_active ON fleet_events (node_class, probe, switch, cause, series_key)
        WHERE ended_at IS NULL
    """,
    # 19: the container image a finished run's probe recorded (``environment.container_image``: IMAGE@sha256:…),
    # shown in the API; the judge restarts a node's baselines when it changes (docs/containers.md)
    """
    ALTER TABLE runs ADD COLUMN container_image TEXT
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the store at ``path`` to ``SCHEMA_VERSION``; refuse a newer one. Each step reads the version
    under the write lock, so processes opening a new store at once (the daemon starting, ``healthd
    status``) apply every migration once."""
    while True:
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{path} has schema version {version}, newer than this healthd ({SCHEMA_VERSION})")
            if version == SCHEMA_VERSION:
                db.execute("COMMIT")
                return
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {version + 1}")
            db.execute("COMMIT")
        except (sqlite3.Error, StoreError):
            db.execute("ROLLBACK")
            raise
