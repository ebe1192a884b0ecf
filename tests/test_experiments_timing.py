"""Where a sweep's time goes: every part is recorded, none is negative, together they fit in
the wall time; the printed breakdown's text; a database from before the ``timings`` column
still opens and sweeps.

Nothing here checks how fast anything is (speed is measured in ``qkvlab bench``).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from qkvlab.experiments.runner import sweep, sweep_ids
from conftest import temporary_experiment, toy_runs

from qkvlab.experiments.store import Store
from qkvlab.experiments.timing import PARTS, format_breakdown, sum_parts, time_breakdown
from qkvlab.train import TIMING_PARTS, run_from_spec

NAME = "toy_timing"
SLACK_S = 0.5  # clocks read a few statements apart


@pytest.fixture
def toy_experiment():
    with temporary_experiment(NAME, toy_runs(checkpoint_every=5, keep_at=[0, 6])) as name:
        yield name


def test_a_run_times_every_part_within_its_wall_time(tmp_path):
    spec = {"task": "test_train_trainer:ToyTask", "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
            "train": {"steps": 10, "batch_size": 4, "eval_batches": 1, "eval_batch_size": 4,
                      "eval_every": 5, "checkpoint_every": 3, "keep_at": [0, 5]}}
    t = time.perf_counter()
    res = run_from_spec(spec, run_dir=tmp_path, progress=False)
    wall = time.perf_counter() - t
    assert set(res.timings) == set(TIMING_PARTS)
    assert all(v >= 0 for v in res.timings.values())
    assert all(res.timings[k] > 0 for k in ("step", "data", "eval", "checkpoint", "setup"))
    assert sum(res.timings.values()) <= wall


@pytest.mark.parametrize("workers", [1, 2])
def test_sweep_breakdown_parts_fit_in_its_wall_time(tmp_path, toy_experiment, workers):
    db, printed = tmp_path / "t.db", []
    t = time.perf_counter()
    counts = sweep(toy_experiment, "smoke", db=db, workers=workers, threads=1, progress=False,
                   log=printed.append)
    wall = time.perf_counter() - t
    assert counts == {"done": 2}
    with Store(db) as store:
        ids = sweep_ids(toy_experiment, "smoke")
        runs = store.timings(ids)
        parts = time_breakdown(store, ids)
        full = time_breakdown(store, ids, wall_s=wall, workers=workers)
    assert list(runs) == ids
    for t in runs.values():  # the trainer's parts and the worker's, each run
        assert set(t) == {*TIMING_PARTS, "store", "startup"} and min(t.values()) >= 0
    assert list(parts) == list(PARTS) and min(parts.values()) >= 0
    assert parts["model step"] > 0 and parts["store"] > 0 and parts["other"] == 0
    assert (parts["start-up"] > 0) == (workers > 1)  # only spawned workers start up
    assert sum(parts.values()) <= workers * wall + SLACK_S
    assert sum(full.values()) == pytest.approx(max(workers * wall, sum(parts.values())))
    assert len(printed) == 1 and printed[0].startswith(f"sweep {NAME} [smoke]: 2 runs trained in ")
    # a second sweep trains nothing and says so
    printed.clear()
    assert sweep(toy_experiment, "smoke", db=db, workers=workers, threads=1, progress=False,
                 log=printed.append) == {"done": 2}
    assert printed[0].startswith(f"sweep {NAME} [smoke]: 0 runs trained in ")
    assert "\n" not in printed[0]


def test_sweep_command_prints_the_breakdown_without_progress_bars(tmp_path, toy_experiment, capsys):
    import argparse

    from qkvlab.experiments import cli
    p = argparse.ArgumentParser()
    cli.configure_sweep(p)
    args = p.parse_args([toy_experiment, "--profile", "smoke", "--db", str(tmp_path / "t.db"),
                         "--workers", "1", "--threads", "1", "--no-progress"])
    assert cli.run_sweep(args) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"sweep {NAME} [smoke]: done 2 in ")
    head, *rows = err.strip().splitlines()
    assert head.startswith(f"sweep {NAME} [smoke]: 2 runs trained in ") and "model step " in head
    assert [r.split()[0] for r in rows] == [n.split()[0] for n in PARTS]


def test_format_breakdown_whole_text():
    parts = {"model step": 45.0, "data": 3.0, "eval": 6.0, "checkpoints": 4.0, "setup": 3.0,
             "logging": 0.5, "store": 0.5, "start-up": 0.0, "other": 3.0}
    assert sum_parts([], wall_s=65.0) == {**dict.fromkeys(PARTS, 0.0), "other": 65.0}
    assert format_breakdown("sweep lm_tied_kv [quick]", parts, runs=9, wall_s=65.0) == (
        "sweep lm_tied_kv [quick]: 9 runs trained in 65.0 s — model step 69% (data 5% · eval 9% · "
        "checkpoints 6% · setup 5% · logging 1% · store 1% · start-up 0% · other 5%)\n"
        "  model step     45.0 s  69%\n"
        "  data            3.0 s   5%\n"
        "  eval            6.0 s   9%\n"
        "  checkpoints     4.0 s   6%\n"
        "  setup           3.0 s   5%\n"
        "  logging         0.5 s   1%\n"
        "  store           0.5 s   1%\n"
        "  start-up        0.0 s   0%\n"
        "  other           3.0 s   5%")
    two = format_breakdown("sweep x [smoke]", {"model step": 3.0, "other": 1.0}, runs=1,
                           wall_s=2.0, workers=2)
    assert two == ("sweep x [smoke]: 1 run trained in 2.0 s on 2 workers (4.0 worker-s) — "
                   "model step 75% (other 25%)\n"
                   "  model step     3.0 s  75%\n"
                   "  other          1.0 s  25%")
    assert format_breakdown("sweep x [smoke]", parts, runs=0, wall_s=1.3) == (
        "sweep x [smoke]: 0 runs trained in 1.3 s")


# The runs table as qkvlab wrote it before the timings column.
OLD_RUNS = """CREATE TABLE runs (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
    step INTEGER, error TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    host TEXT, pid INTEGER, heartbeat REAL,
    created REAL, started REAL, finished REAL, wall_s REAL, train_s REAL,
    tokens INTEGER, tokens_per_s REAL, n_params INTEGER, params TEXT,
    git_rev TEXT, versions TEXT, hardware TEXT)"""


def test_database_without_timings_column_opens_and_sweeps(tmp_path, toy_experiment):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:
        c.execute(OLD_RUNS)
        c.execute("INSERT INTO runs (id, spec, status, finished) VALUES ('old', '{}', 'done', 1.0)")
    assert sweep(toy_experiment, "smoke", db=db, threads=1, progress=False) == {"done": 2}
    for _ in range(2):  # the column is added once; opening again changes nothing
        with Store(db) as store:
            cols = [r["name"] for r in store.conn.execute("PRAGMA table_info(runs)")]
            assert cols.count("timings") == 1 and store.check() == "ok"
            ids = sweep_ids(toy_experiment, "smoke")
            assert list(store.timings(["old", *ids])) == ids  # the old run has none
            assert store.conn.execute("SELECT status FROM runs WHERE id='old'").fetchone()[0] == "done"
            assert time_breakdown(store, ["old"]) == dict.fromkeys(PARTS, 0.0)


def test_a_sweep_worker_does_not_import_scipy_stats():
    """Each spawned worker imports ``experiments.worker`` (the runner imports it too); the
    statistics are for the results command."""
    code = ("import sys, qkvlab.cli, qkvlab.experiments.runner; "
            "print(sorted(m for m in ('scipy.stats', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"
