"""Measures moved between stores: a device machine's store does not outlive its session, so
what it measured comes back as JSON of its measure rows (``Store.measure_rows``' dicts) and is
put into the store the report reads, each row under its own id, spec and env."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qkvlab.experiments.store import Store, run_id


def add_measure_rows(store: Store, rows: list[Mapping[str, Any]]) -> int:
    """Store finished measures read off another store, skipping ones ``store`` holds done;
    returns how many were added.

    Raises:
        ValueError: a row's id is not the hash of its name and spec (edited, or not a row).
    """
    added = 0
    for r in rows:
        if r.get("measure_id") != run_id({"measure": r["name"], **r["spec"]}):
            raise ValueError(f"measure row {r.get('measure_id')!r} ({r.get('name')}): its id "
                             "is not the hash of its name and spec")
        held = store.conn.execute("SELECT 1 FROM measures WHERE id=? AND status='done'",
                                  (r["measure_id"],)).fetchone()
        if held is None:
            store.measure(r["name"], r["spec"], lambda r=r: r["records"], run=r["run_id"],
                          env=r["env"])
            added += 1
    return added
