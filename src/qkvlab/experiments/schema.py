"""The results store's schema, the marker that makes a SQLite file a qkvlab store, and its
migrations (only ever applied to a store that is qkvlab's, only by a write).

``kind(conn)`` tells a store apart by reading alone: ``ours`` (``PRAGMA application_id`` is
:data:`APPLICATION_ID`), ``legacy`` (no marker, but the ``runs`` table an earlier qkvlab
made, whose columns together no other program's table has), ``new`` (a SQLite file with
nothing in it) or ``foreign`` (anything else: left as it is). ``migrate`` creates the tables,
adds the columns newer than a store, and sets the marker; a legacy store also records that
its run folders are the shared ``runs/`` it used before (``store_meta.runs_dir``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

APPLICATION_ID = 0x716B766C  # "qkvl": the SQLite header field that marks a qkvlab store
SCHEMA_VERSION = 2  # user_version: 2 = marker, store_meta, runs.threads and runs.trained_by
# What a store made before the marker holds: qkvlab's first ``runs`` table, whose columns
# together no other program's table has (a ``runs`` table of someone else's is not enough).
LEGACY_RUNS = {"id", "spec", "status", "step", "error", "attempts", "host", "pid", "heartbeat",
               "created", "started", "finished", "wall_s", "train_s", "tokens", "tokens_per_s",
               "n_params", "params", "git_rev", "versions", "hardware"}

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
    step INTEGER, error TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    host TEXT, pid INTEGER, heartbeat REAL,
    created REAL, started REAL, finished REAL, wall_s REAL, train_s REAL,
    tokens INTEGER, tokens_per_s REAL, n_params INTEGER, params TEXT,
    git_rev TEXT, versions TEXT, hardware TEXT, timings TEXT);
CREATE TABLE IF NOT EXISTS members (
    experiment TEXT NOT NULL, profile TEXT NOT NULL, run_id TEXT NOT NULL REFERENCES runs(id),
    tags TEXT NOT NULL, PRIMARY KEY (experiment, profile, run_id, tags));
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, name TEXT NOT NULL,
    value REAL, PRIMARY KEY (run_id, step, name));
CREATE TABLE IF NOT EXISTS final (
    run_id TEXT NOT NULL REFERENCES runs(id), name TEXT NOT NULL, value REAL,
    PRIMARY KEY (run_id, name));
CREATE TABLE IF NOT EXISTS measures (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, run_id TEXT REFERENCES runs(id), spec TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, host TEXT, pid INTEGER,
    created REAL, finished REAL, env TEXT);
CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT);
"""
# Columns of ``runs`` newer than the first schema: added by ALTER TABLE to older databases.
ADDED_COLUMNS = {"timings": "TEXT", "threads": "INTEGER", "trained_by": "TEXT"}




def kind(conn: sqlite3.Connection) -> str:
    """``ours``, ``legacy``, ``new`` or ``foreign`` (see the module docstring); reads only.

    Raises:
        sqlite3.DatabaseError: the file is not a SQLite database.
    """
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    if app == APPLICATION_ID:
        return "ours"
    objects = conn.execute("SELECT name FROM sqlite_master WHERE type IN "
                           "('table', 'view', 'index', 'trigger')").fetchall()
    if app == 0 and not objects:
        return "new"
    columns = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    return "legacy" if app == 0 and LEGACY_RUNS <= columns else "foreign"


def classify(path: Path) -> str:
    """:func:`kind` of the file at ``path``, or ``not sqlite``, leaving nothing beside it.

    A SQLite connection, even read-only, creates ``-wal`` and ``-shm`` files beside a database
    in WAL mode; another program's database must not get them. So the header is read as bytes
    (the marker is at offset 68), and only a file without it is opened ``immutable`` to look at
    its tables. Call it only where no ``-wal`` file exists: then the file holds every change.
    """
    with open(path, "rb") as f:
        head = f.read(100)
    if not head:
        return "new"
    if not head.startswith(b"SQLite format 3\0"):
        return "not sqlite"
    if int.from_bytes(head[68:72], "big") == APPLICATION_ID:
        return "ours"
    conn = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro&immutable=1",
                           uri=True)
    try:
        return kind(conn)
    except sqlite3.DatabaseError:
        return "not sqlite"
    finally:
        conn.close()


def foreign_message(conn: sqlite3.Connection, path: Path) -> str:
    tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'"))
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    return (f"db: {path} is a SQLite database but not a qkvlab results database (no qkvlab "
            f"marker: application_id {app}; tables {tables[:8]}); qkvlab leaves it as it is. "
            "Give --db a new file name (or one qkvlab made)")


def migrate(conn: sqlite3.Connection, legacy: bool, tx) -> None:
    """Bring a store (new, legacy or ours) up to the current schema and mark it; ``tx`` opens
    a write transaction (``Store.tx``). The column check runs again inside the write lock, so
    two processes opening one old file add a column once."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes
    conn.executescript(SCHEMA)  # idempotent; executescript commits by itself

    def missing() -> list[str]:
        have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        return [c for c in ADDED_COLUMNS if c not in have]
    if missing():
        with tx() as c:
            for col in missing():
                c.execute(f"ALTER TABLE runs ADD COLUMN {col} {ADDED_COLUMNS[col]}")
    if legacy:  # this store's checkpoints already live in the shared runs/ folder
        with tx() as c:
            c.execute("INSERT OR IGNORE INTO store_meta VALUES ('runs_dir', 'runs')")
    if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
