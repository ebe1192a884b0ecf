"""The measures half of the results store: what is measured besides training (speed, folding,
the pretrained analysis, statistics of a trained model), one row per (name, spec) in the
``measures`` table, computed once and read back. :class:`~qkvlab.experiments.store.Store`
inherits it; it reads the store's connection, transactions and JSON helpers.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from typing import Any, Callable, Mapping

from qkvlab.experiments.ids import canonical, pid_alive, run_id
from qkvlab.inputs import InputFileError


class MeasureStore:
    """``measure``, ``measure_names`` and ``measure_rows`` of a :class:`Store`."""

    def _records(self, text: str | None, mid: str) -> list:
        doc = self._json(text, mid, "result", "measure")
        if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
            raise InputFileError(f"db: {self.path}: measure {mid!r}: its result is not a list of "
                                 "records; the store is damaged or was changed by hand",
                                 path=self.path)
        return doc["records"]

    def measure(self, name: str, spec: Mapping[str, Any], compute: Callable[[], Any], *,
                run: str | None = None, env: Mapping[str, Any] | None = None) -> list[dict]:
        """The stored records of measure ``name`` on ``spec``, computing them if absent.

        ``spec`` must hold everything the result depends on (sizes, a version, the ids of the
        runs it reads); ``run`` is the trained run it measures, if any. ``compute()`` returns
        one flat record (a dict) or a list of them; they are stored as one JSON document.

        Raises:
            InputFileError: ``compute`` refused its input (raised as it is; the row keeps it).
            ValueError: ``compute`` failed (the traceback is kept in the row), returned
                something that is not records of JSON scalars, or another live process holds
                the same measure.
        """
        mid = run_id({"measure": name, **spec})
        row = self.conn.execute("SELECT status, result, host, pid FROM measures WHERE id=?",
                                (mid,)).fetchone()
        if row is not None and row["status"] == "done":
            return self._records(row["result"], mid)
        if row is not None and row["status"] == "running" and row["host"] == socket.gethostname() \
                and pid_alive(row["pid"]) and row["pid"] != os.getpid():
            raise ValueError(f"measure {name}: {mid} is being computed by process {row['pid']}")
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO measures (id, name, run_id, spec, status, host, pid,"
                      " created) VALUES (?,?,?,?,'running',?,?,?)",
                      (mid, name, run, canonical(dict(spec)), socket.gethostname(), os.getpid(),
                       time.time()))
        try:
            out = compute()
            records = [dict(out)] if isinstance(out, Mapping) else [dict(r) for r in out]
            doc = canonical({"records": records})  # fails on anything JSON cannot hold
        except Exception as e:
            with self.tx() as c:
                c.execute("UPDATE measures SET status='failed', error=? WHERE id=?",
                          (traceback.format_exc()[-4000:], mid))
            if isinstance(e, InputFileError):  # bad input, not a failed measure: as it is
                raise
            raise ValueError(f"measure {name} failed: {type(e).__name__}: {e}") from e
        with self.tx() as c:
            c.execute("UPDATE measures SET status='done', result=?, error=NULL, finished=?, env=?"
                      " WHERE id=?", (doc, time.time(), canonical(env or {}), mid))
        return json.loads(doc)["records"]

    def measure_names(self) -> list[str]:
        """Names of the measures with a finished result."""
        if not self._has_table("measures"):  # a store older than measures, opened read-only
            return []
        return [r[0] for r in self.conn.execute(
            "SELECT DISTINCT name FROM measures WHERE status='done' ORDER BY name")]

    def measure_rows(self, name: str | None = None) -> list[dict[str, Any]]:
        """Finished measures (all, or one ``name``): id, name, run_id, spec, records, env."""
        if not self._has_table("measures"):
            return []
        q = ("SELECT id, name, run_id, spec, result, env FROM measures WHERE status='done'"
             " AND (? IS NULL OR name=?) ORDER BY name, created, id")
        return [{"measure_id": r["id"], "name": r["name"], "run_id": r["run_id"],
                 "spec": self._json(r["spec"], r["id"], "spec", "measure"),
                 "records": self._records(r["result"], r["id"]),
                 "env": self._json(r["env"], r["id"], "env", "measure") or {}}
                for r in self.conn.execute(q, (name, name))]
