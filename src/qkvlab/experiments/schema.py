"""The results store's schema, the marker that makes a SQLite file a qkvlab store, its
migrations (only ever applied to a store that is qkvlab's, only by a write), and how a file is
judged and opened as a store.

``kind(conn)`` tells a store apart by reading alone: ``ours`` (``PRAGMA application_id`` is
:data:`APPLICATION_ID`), ``legacy`` (no marker, but the ``runs`` table an earlier qkvlab
made: its columns together, with ``id`` its primary key), ``new`` (a SQLite file with
nothing in it) or ``foreign`` (anything else: left as it is). ``migrate`` creates the tables,
adds the columns newer than a store, and sets the marker; a legacy store also records that
its run folders are the shared ``runs/`` it used before (``store_meta.runs_dir``).
``connect`` judges a file and opens it for the ``Store``: before any connection where it can
be, so another program's database is refused without a byte written beside it.

Tables:
    runs      one row per run; ``id`` = hash of its spec, so a re-run finds what is done.
              status: pending -> running -> done | diverged | failed. ``timings`` (JSON) says
              where a finished run's last attempt spent its time, in seconds per part
              (``experiments.timing``); a column added in place to databases that predate it.
    members   which experiment/profile lists a run, with its tags (design, arm, seed, ...);
              one run may serve several experiments (a ``standard`` baseline, say).
    metrics   (run_id, step, name) -> value, written while training; rewriting a step after a
              resume replaces the row, so a killed-and-resumed run never duplicates rows.
    final     (run_id, name) -> value, written in one transaction with status ``done``.
    measures  what is measured besides training (speed, folding, the pretrained analysis,
              statistics of a trained model): id = hash of (name, spec); ``run_id`` names the
              trained run it reads, if any; ``result`` is a JSON document ``{"records": [...]}``
              of flat records (one table row each), written in one transaction with ``done``.
    store_meta  key -> value facts about the store itself (``runs_dir`` of an older store).

Columns of ``runs`` that change nothing in a result but say how it was produced: ``threads``
(torch threads the run trained with: two one-thread workers and one two-thread worker give
results that differ in the last bits) and ``trained_by`` (``host:pid`` of the sweep process
that trained it, so a sweep's time breakdown counts only its own runs).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from qkvlab.inputs import InputFileError

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


def _columns_of_schema() -> dict[str, set[str]]:
    """Each table of :data:`SCHEMA` -> its columns (read from SQLite itself, not parsed)."""
    c = sqlite3.connect(":memory:")
    try:
        c.executescript(SCHEMA)
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {r[1] for r in c.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    finally:
        c.close()


# What every qkvlab store has in each of its tables (a table it lacks is an older store's);
# a column renamed or lost (a damaged schema page) is refused before any read meets it
REQUIRED_COLUMNS = {t: cols - (set(ADDED_COLUMNS) if t == "runs" else set())
                    for t, cols in _columns_of_schema().items()}


def lost_columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """``{table: [missing columns]}`` of the store's tables against :data:`REQUIRED_COLUMNS`
    (``runs`` always: every qkvlab store has it; a table added later may be absent)."""
    present = {r[0] for r in sqlite3.Connection.execute(
        conn, "SELECT name FROM sqlite_master WHERE type='table'")}
    out = {}
    for t in sorted((present & set(REQUIRED_COLUMNS)) | {"runs"}):
        have = {r[1] for r in sqlite3.Connection.execute(conn, f'PRAGMA table_info("{t}")')}
        if REQUIRED_COLUMNS[t] - have:
            out[t] = sorted(REQUIRED_COLUMNS[t] - have)
    return out




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
    info = conn.execute("PRAGMA table_info(runs)").fetchall()
    columns, key = {r[1] for r in info}, {r[1] for r in info if r[5]}
    # qkvlab's runs table always had ``id`` as its primary key: old column names alone are a
    # look-alike, and adopting it would write into another program's file
    return "legacy" if app == 0 and LEGACY_RUNS <= columns and key == {"id"} else "foreign"


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


def connect(path: str | os.PathLike, readonly: bool) -> tuple[sqlite3.Connection, str]:
    """Open the store at ``path`` for writing (the parent folder made if missing), or
    ``readonly``, once the file is known to be a store: a connection whose rows are
    ``sqlite3.Row``, and the file's :func:`kind` (``new``, ``ours`` or ``legacy``; not
    migrated here). A file without a ``-wal`` beside it is judged before connecting
    (:func:`classify`).

    Raises:
        InputFileError: the path is a folder, an empty file (only a path that names nothing
            becomes a new store: an empty file may be another program's, or a store cut short),
            a file that is not a qkvlab store, or, read only, a store that does not exist or is
            empty.
    """
    shown = Path(path)
    if shown.is_dir():
        raise InputFileError(f"db: {shown} is a folder, not a results database", path=path)
    if readonly and not shown.is_file():
        raise InputFileError(f"db: no results database at {shown}", path=path)
    fresh = not shown.exists()
    if not fresh and shown.stat().st_size == 0:  # as a sweep (which reads it first) says
        raise InputFileError(f"db: {shown} is empty, not a results database", path=path)
    known = None  # without a -wal file the file holds everything: judge it before connecting
    if not fresh and not Path(f"{shown}-wal").exists():
        known = classify(shown)
        if known == "foreign":
            c = sqlite3.connect(f"file:{quote(str(shown.resolve()))}?mode=ro&immutable=1",
                                uri=True)
            try:
                raise InputFileError(foreign_message(c, shown), path=path)
            finally:
                c.close()
        if known == "not sqlite":
            raise InputFileError(f"db: {shown} is not a qkvlab results database (file is "
                                 "not a SQLite database)", path=path)
        if not readonly:  # nothing is written into a damaged file, nor left beside it
            c = sqlite3.connect(f"file:{quote(str(shown.resolve()))}?mode=ro&immutable=1",
                                uri=True)
            try:
                check_intact(c, shown)
            finally:
                c.close()
    if not readonly:
        shown.parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE takes the
        # write lock up front, so two workers never both read "pending" and both claim).
        # Read only, a file that holds every change (no -wal beside it: no writer has it open)
        # is read immutable, since even a mode=ro connection leaves -wal/-shm beside a WAL
        # database; where a -wal exists, a writer may be live and locks are needed.
        ro = "mode=ro&immutable=1" if known is not None else "mode=ro"
        target = f"file:{quote(str(shown.resolve()))}?{ro}" if readonly else str(shown)
        conn = sqlite3.connect(target, timeout=120, isolation_level=None, uri=readonly,
                               factory=StoreConnection)
    except sqlite3.Error as e:
        raise InputFileError(f"db: {shown} cannot be opened as a results database ({e})",
                             path=path) from None
    conn.shown = shown
    conn.row_factory = sqlite3.Row
    conn.text_factory = text_reader(shown, target, readonly)
    try:
        found = "new" if fresh else known or kind(conn)
        if found == "new" and readonly:
            raise InputFileError(f"db: {shown} is empty, not a results database", path=path)
        if found == "foreign":
            raise InputFileError(foreign_message(conn, shown), path=path)
        if not readonly and found != "new" and known is None:  # judged above where it can be
            check_intact(conn, shown)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise InputFileError(f"db: {shown} is not a qkvlab results database ({e})",
                             path=path) from None
    except InputFileError:
        conn.close()
        raise
    return conn, found


def check_intact(conn: sqlite3.Connection, shown: Path) -> None:
    """Refuse a store that fails SQLite's ``integrity_check``: not ``quick_check``, which passes
    an index that disagrees with its table, damage the first write through it finds (25 ms
    on a 2.8 MB store)."""
    try:  # the plain method: SQLite's own message, not StoreConnection's
        rows = sqlite3.Connection.execute(conn, "PRAGMA integrity_check(3)").fetchall()
        said = " ".join(" ".join(r[0] for r in rows).split())
    except sqlite3.DatabaseError as e:  # the check itself met the damage
        said = str(e)
    if said != "ok":
        raise InputFileError(f"db: {shown} fails SQLite's integrity_check ({said[:300]}); "
                             "the store is damaged, and qkvlab writes nothing to it", path=shown)


DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def damaged(shown: Path, e: sqlite3.DatabaseError) -> InputFileError | None:
    """The one-line error for SQLite finding the file damaged mid-read (an index that disagrees
    with its table passes ``quick_check``; a store opened to be written passes
    ``integrity_check`` first), or None for any other error (locked, disk full)."""
    if (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF not in DAMAGED:
        return None
    return InputFileError(f"db: {shown} is damaged ({e}); qkvlab reads and writes nothing more "
                          "from it", path=shown)


class _Cursor(sqlite3.Cursor):
    """A cursor whose damaged-file errors are :func:`damaged`'s one line, wherever a read
    meets the damage: at ``execute`` or while rows are fetched."""

    def _guard(self, call, *args):
        try:
            return call(*args)
        except sqlite3.DatabaseError as e:
            err = damaged(self.connection.shown, e)
            if err is None:
                raise
            raise err from None

    def execute(self, *args):
        return self._guard(super().execute, *args)

    def executemany(self, *args):
        return self._guard(super().executemany, *args)

    def fetchone(self):
        return self._guard(super().fetchone)

    def fetchall(self):
        return self._guard(super().fetchall)

    def __next__(self):
        return self._guard(super().__next__)


class StoreConnection(sqlite3.Connection):
    """The store's connection: every statement runs on a :class:`_Cursor`."""

    shown: Path

    def cursor(self, factory=_Cursor):
        return super().cursor(factory)

    def execute(self, sql, params=()):
        return self.cursor().execute(sql, params)

    def executemany(self, sql, params):
        return self.cursor().executemany(sql, params)


def text_reader(shown: Path, target: str, uri: bool):
    """The store's ``text_factory``: TEXT to ``str``; a value that is not UTF-8 (a store
    damaged or changed by hand) is an ``InputFileError`` naming the store and the row and
    column that hold it, where sqlite3 would raise an ``OperationalError`` with neither."""
    def text(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputFileError(f"db: {shown}: {locate(target, uri, raw)} is not UTF-8 text "
                                 f"({e.reason} at byte {e.start}); the store is damaged or was "
                                 "changed by hand", path=shown) from None
    return text


def locate(target: str, uri: bool, raw: bytes) -> str:
    """Where the text value ``raw`` sits in the store, found on a second connection:
    ``table runs, row id '…', column spec`` (or ``a text value`` if it cannot be found)."""
    def show(v) -> str:
        return repr(v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v)
    try:
        c = sqlite3.connect(target, uri=uri, timeout=5)
    except sqlite3.Error:
        return "a text value"
    try:
        c.text_factory = bytes
        tables = [r[0].decode() for r in c.execute(
            "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for t in tables:
            cols = [r[1].decode() for r in c.execute(f'PRAGMA table_info("{t}")')]
            key = next((k for k in ("id", "run_id", "key") if k in cols), "rowid")
            for col in cols:
                row = c.execute(f'SELECT "{key}" FROM "{t}" WHERE typeof("{col}") = \'text\' '
                                f'AND CAST("{col}" AS BLOB) = ? LIMIT 1', (raw,)).fetchone()
                if row is not None:
                    return f"table {t}, row {key} {show(row[0])}, column {col}"
    except (sqlite3.Error, UnicodeDecodeError):
        pass
    finally:
        c.close()
    return "a text value"
