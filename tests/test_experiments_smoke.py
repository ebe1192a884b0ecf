"""Every registered experiment end to end on the smoke profile (the CI check; needs the
offline data packages). Slow: ~2-3 min for all on 2 cores."""

from __future__ import annotations

import pytest

from qkvlab.experiments.registry import EXPERIMENTS, runs_of
from qkvlab.experiments.runner import sweep
from qkvlab.experiments.store import Store, run_id


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_smoke_sweep_records_every_run(name, tmp_path):
    db = tmp_path / "qkvlab.db"
    counts = sweep(name, "smoke", db=db, progress=False)
    ids = {run_id(s) for s, _ in runs_of(name, "smoke")}
    assert counts == {"done": len(ids)}
    with Store(db) as s:
        rows = s.runs(name, "smoke")
        assert {r["id"] for r in rows} == ids and s.check() == "ok"
        for r in rows:
            assert r["final"] and r["n_params"] > 0 and r["tokens_per_s"] > 0
            assert r["versions"]["torch"] and r["hardware"]["cpu_count"]
    assert sweep(name, "smoke", db=db, progress=False) == counts  # re-run: nothing redone
