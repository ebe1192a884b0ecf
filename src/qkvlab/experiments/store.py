"""The results store: one SQLite file (WAL mode), safe for concurrent worker processes.

A store is marked as qkvlab's in the SQLite header (``PRAGMA application_id`` =
:data:`schema.APPLICATION_ID`, ``user_version`` = :data:`schema.SCHEMA_VERSION`).
``Store(path)`` opens it for writing: it creates a new store, or adds the marker and any
missing columns to one that a qkvlab before the marker made (it has qkvlab's tables), and
refuses any other SQLite file without touching it. ``Store(path, readonly=True)`` (what read
commands use) opens the file read-only and changes nothing, not even to a store that still
lacks the marker.

Run folders (checkpoints, final weights) live in :attr:`Store.runs_dir`, which belongs to this
store alone: ``<store path>-runs/`` (``results/qkvlab.db-runs/``), so two stores never resume
each other's runs. Stores made before that rule keep the folder they used, ``runs/`` beside
the file (recorded in ``store_meta`` when the marker is added), so their unfinished runs still
resume and their finished runs' weights are still found.

Its tables and their columns: :mod:`qkvlab.experiments.schema`; its measures (a mixin):
:mod:`qkvlab.experiments.measure_store`; ids: :mod:`qkvlab.experiments.ids`.

Every statement that changes more than one row runs in one transaction, so a SIGKILL at any
moment leaves the file consistent (SQLite's WAL guarantees this for process crashes).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from qkvlab.experiments import schema
from qkvlab.experiments.measure_store import MeasureStore
from qkvlab.experiments.ids import canonical, pid_alive, run_id  # noqa: F401 (their home was here)
from qkvlab.inputs import InputFileError

DEFAULT_DB = Path("results") / "qkvlab.db"
RUNS_SUFFIX = "-runs"  # a store's run folders: <store path>-runs/
FINISHED = ("done", "diverged")
STATUSES = ("pending", "running", "done", "diverged", "failed")


class Store(MeasureStore):
    """A connection to the results store at ``path``: for writing (created on first use, an
    older qkvlab store brought up to date), or ``readonly`` (nothing is ever written).

    Raises:
        InputFileError: the path is a folder, or a file that is not a qkvlab store (a SQLite
            database of another program is refused before anything is written to it), or, read
            only, a store that does not exist.
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_DB, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self.conn, kind = schema.connect(path, readonly)
        try:
            # a marked store's tables hold every column of the schema (a legacy one was
            # recognized by its runs table's columns); a renamed column is damage
            lost = schema.lost_columns(self.conn) if kind == "ours" else {}
            if lost:
                t, cols = next(iter(lost.items()))
                raise InputFileError(f"db: {self.path}: its {t} table lacks the columns {cols} "
                                     "every qkvlab store has; the store is damaged or was "
                                     "changed by hand", path=path)
            if not readonly:
                self._migrate(legacy=kind == "legacy")
            self._columns = {r["name"] for r in self.conn.execute("PRAGMA table_info(runs)")}
            self._meta = ({r["key"]: r["value"] for r in self.conn.execute(
                "SELECT key, value FROM store_meta")} if self._has_table("store_meta") else {})
            self._legacy = kind == "legacy" or self._meta.get("runs_dir") is not None
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise InputFileError(f"db: {self.path} is not a qkvlab results database ({e})",
                                 path=path) from None
        except InputFileError:
            self.conn.close()
            raise

    def _has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                                 (name,)).fetchone() is not None

    def _migrate(self, legacy: bool) -> None:
        """WAL, the tables, missing columns, and the marker: only ever on our own store."""
        schema.migrate(self.conn, legacy, self.tx)

    @property
    def runs_dir(self) -> Path:
        """Where this store's run folders (checkpoints, final weights, config.json) live:
        ``<store path>-runs``, or ``runs/`` beside a store made before that rule."""
        if self._legacy:
            return self.path.parent / self._meta.get("runs_dir", "runs")
        return self.path.with_name(self.path.name + RUNS_SUFFIX)

    @property
    def trainer(self) -> str:
        """``host:pid`` of this process, as ``trained_by`` records the runs it trains."""
        return f"{socket.gethostname()}:{os.getpid()}"

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def tx(self):
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error).

        Raises:
            ValueError: the store was opened read-only.
        """
        if self.readonly:
            raise ValueError(f"db: {self.path} was opened read-only; nothing can be written")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ---- writing -------------------------------------------------------------------------
    def add(self, experiment: str, profile: str, runs: Iterable[tuple[Any, Mapping]],
            replace: bool = False) -> list[str]:
        """Register (spec, tags) pairs under an experiment; returns their ids in order.

        A spec is a ``RunSpec`` (its canonical ``to_dict()`` is stored) or a plain mapping.

        Existing runs are kept as they are (finished ones are not re-run). ``replace``: the
        pairs are the experiment's whole list at ``profile`` (a sweep's), so memberships it no
        longer makes (a profile's earlier settings: other ids or tags) are dropped in the same
        transaction; their runs and results stay in the store, and come back as they were if
        a later definition lists them again.
        """
        ids, now = [], time.time()
        with self.tx() as c:
            if replace:
                c.execute("DELETE FROM members WHERE experiment=? AND profile=?",
                          (experiment, profile))
            for spec, tags in runs:
                d = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)  # a RunSpec
                rid = run_id(d)
                ids.append(rid)
                c.execute("INSERT OR IGNORE INTO runs (id, spec, status, created) VALUES (?,?,?,?)",
                          (rid, canonical(d), "pending", now))
                c.execute("INSERT OR IGNORE INTO members VALUES (?,?,?,?)",
                          (experiment, profile, rid, canonical(dict(tags))))
        return ids

    def reclaim(self, stale_s: float = 900.0) -> int:
        """Mark runs whose worker died as pending again; returns how many.

        A run counts as orphaned if its worker ran on this host and that process is gone,
        or if its heartbeat is older than ``stale_s`` (a worker elsewhere).
        """
        host, now, n = socket.gethostname(), time.time(), 0
        rows = self.conn.execute("SELECT id, host, pid, heartbeat FROM runs "
                                 "WHERE status='running'").fetchall()
        dead = [r["id"] for r in rows
                if (r["host"] == host and not pid_alive(r["pid"]))
                or (r["heartbeat"] or 0) < now - stale_s]
        if dead:
            with self.tx() as c:
                for rid in dead:
                    n += c.execute("UPDATE runs SET status='pending' "
                                   "WHERE id=? AND status='running'", (rid,)).rowcount
        return n

    def claim(self, rid: str, by: str | None = None) -> bool:
        """Atomically take a pending/failed run for this process; False if someone else has it.
        ``by``: the sweep it trains for (``host:pid`` of the sweep process; default this one)."""
        now = time.time()
        with self.tx() as c:
            cur = c.execute(
                "UPDATE runs SET status='running', host=?, pid=?, heartbeat=?, error=NULL, "
                "started=COALESCE(started, ?), attempts=attempts+1, trained_by=? "
                "WHERE id=? AND status IN ('pending','failed')",
                (socket.gethostname(), os.getpid(), now, now, by or self.trainer, rid))
        return cur.rowcount == 1

    def log(self, rid: str, step: int, metrics: Mapping[str, float]) -> None:
        """Per-step metrics (replacing the same step's values from an earlier attempt)."""
        with self.tx() as c:
            c.executemany("INSERT OR REPLACE INTO metrics VALUES (?,?,?,?)",
                          [(rid, int(step), k, float(v)) for k, v in metrics.items()])
            c.execute("UPDATE runs SET heartbeat=? WHERE id=?", (time.time(), rid))

    def finish(self, rid: str, status: str, step: int, final: Mapping[str, float],
               info: Mapping[str, Any]) -> None:
        """Record a finished run (``done`` or ``diverged``) and its final metrics at once.
        ``info``: what ``worker.execute`` returns as ``info`` (timings, parameter counts,
        tokens/s, ``threads``, versions, hardware, git revision)."""
        if status not in FINISHED:
            raise ValueError(f"status: {status!r} is not one of {list(FINISHED)}")
        cols = ("wall_s", "train_s", "tokens", "tokens_per_s", "n_params", "threads")
        jcols = ("params", "versions", "hardware")
        with self.tx() as c:
            c.execute("DELETE FROM final WHERE run_id=?", (rid,))
            c.executemany("INSERT INTO final VALUES (?,?,?)",
                          [(rid, k, float(v)) for k, v in final.items()])
            sets = ", ".join(f"{k}=?" for k in cols + jcols + ("git_rev",))
            c.execute(f"UPDATE runs SET status=?, step=?, finished=?, error=NULL, {sets} "
                      "WHERE id=?",
                      (status, int(step), time.time(), *(info.get(k) for k in cols),
                       *(canonical(info.get(k)) for k in jcols), info.get("git_rev"), rid))

    def record_timings(self, rid: str, timings: Mapping[str, float]) -> None:
        """Where a finished run's time went (seconds per part); replaces an earlier record."""
        with self.tx() as c:
            c.execute("UPDATE runs SET timings=? WHERE id=?",
                      (canonical({k: float(v) for k, v in timings.items()}), rid))

    def fail(self, rid: str, error: str) -> None:
        """Record an exception; a later sweep retries the run."""
        with self.tx() as c:
            c.execute("UPDATE runs SET status='failed', error=? WHERE id=?", (error[-4000:], rid))

    # ---- reading -------------------------------------------------------------------------
    def status(self, rid: str) -> str | None:
        row = self.conn.execute("SELECT status FROM runs WHERE id=?", (rid,)).fetchone()
        return row["status"] if row else None

    def error(self, rid: str) -> str | None:
        """The traceback a failed run left (its last 4000 characters), or None."""
        row = self.conn.execute("SELECT error FROM runs WHERE id=?", (rid,)).fetchone()
        return row["error"] if row else None

    def runs_spec(self, rid: str) -> dict[str, Any]:
        """The spec stored under ``rid``, once it hashes to ``rid`` (the id is its hash).

        Raises:
            InputFileError: the stored spec is not JSON, or hashes to another id: the store
                is damaged or was changed by hand, and nothing is built from it.
        """
        row = self.conn.execute("SELECT spec FROM runs WHERE id=?", (rid,)).fetchone()
        if row is None:
            raise ValueError(f"run: no run with id {rid!r} in {self.path}")
        try:
            spec = json.loads(row["spec"])
        except (TypeError, ValueError, RecursionError) as e:
            spec = e
        return self._hashed(rid, spec)

    def _hashed(self, rid: str, spec: Any) -> Any:
        """``spec`` (parsed, or the error parsing it raised) once it hashes to ``rid``."""
        try:
            found = (f"nothing ({type(spec).__name__})" if isinstance(spec, Exception)
                     else run_id(spec))
        except (TypeError, ValueError, RecursionError) as e:
            found = f"nothing ({type(e).__name__})"
        if found != rid:
            raise InputFileError(f"db: {self.path}: run {rid}: the spec stored under this id "
                                 f"hashes to {found}; the store is damaged or was changed by "
                                 "hand (refused)", path=self.path)
        return spec

    def runs(self, experiment: str | None = None,
             profile: str | None = None) -> list[dict[str, Any]]:
        """One dict per (run, tags) membership: run columns, ``tags`` and ``final`` metrics."""
        if not self._has_table("members"):  # a partial older store, opened read-only
            return []
        q = ("SELECT m.experiment, m.profile, m.tags, r.* FROM members m"
             " JOIN runs r ON r.id=m.run_id"
             " WHERE (? IS NULL OR m.experiment=?) AND (? IS NULL OR m.profile=?)"
             " ORDER BY m.experiment, m.profile, m.tags")
        rows = [dict(r) for r in self.conn.execute(q, (experiment, experiment, profile, profile))]
        finals: dict[str, dict[str, float]] = {}
        for r in self.conn.execute("SELECT run_id, name, value FROM final"):
            finals.setdefault(r["run_id"], {})[r["name"]] = r["value"]
        for r in rows:
            for k in ("tags", "spec", "params", "versions", "hardware", "timings"):
                r[k] = self._json(r[k], r["id"], k)
            self._hashed(r["id"], r["spec"])  # what a reader shows is what was trained
            r["final"] = finals.get(r["id"], {})
        return rows

    def _json(self, text: str | None, rid: str, column: str, row: str = "run") -> Any:
        try:
            return json.loads(text) if text else None
        except (ValueError, RecursionError) as e:  # text that is not UTF-8: schema.text_reader
            raise InputFileError(f"db: {self.path}: {row} {rid!r}: its {column} column is not "
                                 f"JSON ({type(e).__name__}); the store is damaged or "
                                 "was changed by hand", path=self.path) from None

    def timings(self, ids: Iterable[str], since: float | None = None,
                by: str | None = None) -> dict[str, dict[str, float]]:
        """``{run id: timings}`` of those of ``ids`` with recorded timings, in the order of
        ``ids``. With ``since`` (a ``time.time()``): only runs finished at or after it and
        trained by ``by`` (``host:pid`` of a sweep process; default this process), so a sweep's
        time breakdown never counts the runs a concurrent sweep trained into the same store."""
        if "timings" not in self._columns:  # a store older than timings, opened read-only
            return {}
        by = by or self.trainer
        mine = "trained_by" in self._columns
        out: dict[str, dict[str, float]] = {}
        for rid in dict.fromkeys(ids):
            row = self.conn.execute(f"SELECT timings, finished{', trained_by' if mine else ''} "
                                    "FROM runs WHERE id=?", (rid,)).fetchone()
            if row is None or not row["timings"]:
                continue
            if since is not None and ((row["finished"] or 0) < since
                                      or not mine or row["trained_by"] != by):
                continue
            out[rid] = json.loads(row["timings"])
        return out

    def metrics(self, rid: str) -> list[dict[str, Any]]:
        """Per-step metrics of one run as ``{step, name, value}`` rows, ordered."""
        return [dict(r) for r in self.conn.execute(
            "SELECT step, name, value FROM metrics WHERE run_id=? ORDER BY step, name", (rid,))]

    def counts(self) -> dict[str, int]:
        """Row counts per table (for integrity checks)."""
        return {t: self.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("runs", "members", "metrics", "final", "measures") if self._has_table(t)}

    # ---- measures ------------------------------------------------------------------------
    def check(self) -> str:
        """SQLite's own integrity check: ``ok`` or the problems it found."""
        return "; ".join(r[0] for r in self.conn.execute("PRAGMA integrity_check"))
