"""Sweeps into the SQLite store: SIGKILL at random moments, then re-run, equals an
uninterrupted sweep; a diverging config is recorded and the rest complete; concurrent sweeps
share the work.

The sweeps run ``ToyTask`` (tests/test_train_trainer.py) in subprocesses: the experiment
``toy_sweep`` is registered by the small driver script below.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkvlab.experiments.store import Store

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

DRIVER = """
import sys
from qkvlab.experiments.registry import experiment
from qkvlab.experiments.runner import sweep

@experiment("toy_sweep")
def toy(profile):
    runs = []
    for seed in (0, 1):
        for design in ("standard", "tied_qk"):
            spec = {"task": "test_train_trainer:ToyTask", "kind": "decoder",
                    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "design": design},
                    "train": {"steps": 150, "batch_size": 4, "eval_batches": 1,
                              "eval_batch_size": 4, "log_every": 3, "eval_every": 10,
                              "checkpoint_every": 7, "seed": seed}}
            runs.append((spec, {"design": design, "seed": seed}))
    nan = {"task": "test_train_trainer:ToyTask", "model": {"d_model": 16, "n_layers": 1,
           "n_heads": 2}, "train": {"steps": 40, "batch_size": 4, "lr": 1e30, "warmup": 0,
           "grad_clip": 0.0, "eval_batch_size": 4, "eval_batches": 1}}
    runs.append((nan, {"design": "nan", "seed": 0}))
    return runs

print(sweep("toy_sweep", "smoke", workers=int(sys.argv[2]), db=sys.argv[1], progress=False,
            threads=1, task_modules=["test_train_trainer"]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(SRC), env.get("PYTHONPATH", "")])
    return env


def _start(db: Path, workers: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(db), str(workers)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _snapshot(db: Path) -> dict:
    """Everything a sweep's result consists of, minus timings and process bookkeeping."""
    with Store(db) as s:
        assert s.check() == "ok"
        runs = {r["id"]: (r["status"], r["step"], r["final"], r["tags"], r["spec"], r["n_params"])
                for r in s.runs("toy_sweep")}
        metrics = sorted(tuple(r) for r in s.conn.execute(
            "SELECT run_id, step, name, value FROM metrics"))
        return {"runs": runs, "metrics": metrics, "counts": s.counts()}


def _progress(db: Path) -> tuple[int, int]:
    """(metric rows, finished runs) so far; (-1, -1) before the store exists."""
    if not db.exists():
        return -1, -1
    try:
        with Store(db) as s:
            m = s.conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
            f = s.conn.execute("SELECT COUNT(*) FROM runs WHERE status IN ('done','diverged')"
                               ).fetchone()[0]
            return m, f
    except Exception:  # the store is being created right now
        return -1, -1


def _killed_then_finished(db: Path, workers: int, kills: int, rng: random.Random) -> int:
    """SIGKILL ``kills`` sweeps (the first during start-up, the rest right after they made
    progress, at a random delay), then run one to the end. Returns kills that hit a run
    in flight (a run ``running`` in the store when it was killed)."""
    mid_run, last = 0, _progress(db)
    for k in range(kills):
        p = _start(db, workers)
        if k == 0:
            time.sleep(rng.uniform(0.2, 1.5))
        else:
            t0 = time.time()
            while _progress(db) == last and time.time() - t0 < 60 and p.poll() is None:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.2))  # a run takes ~0.5 s once going
        p.send_signal(signal.SIGKILL)
        p.communicate()
        last = _progress(db)
        if db.exists():
            with Store(db) as s:
                mid_run += s.conn.execute("SELECT COUNT(*) FROM runs WHERE status='running'"
                                          ).fetchone()[0] > 0
    p = _start(db, workers)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return mid_run


def _check_equal(ref: dict, got: dict) -> None:
    assert got["counts"] == ref["counts"]
    assert got["runs"] == ref["runs"]
    assert got["metrics"] == ref["metrics"]
    statuses = sorted(v[0] for v in ref["runs"].values())
    assert statuses == ["diverged"] + ["done"] * 4


def _reference(tmp_path: Path, workers: int) -> dict:
    db = tmp_path / "ref" / "qkvlab.db"
    p = _start(db, workers)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return _snapshot(db)


@pytest.mark.slow  # ~20 s: seven sweep processes each import torch
def test_sigkill_sweep_five_times_then_rerun_equals_uninterrupted(tmp_path):
    ref = _reference(tmp_path, 1)
    db = tmp_path / "killed" / "qkvlab.db"
    assert _killed_then_finished(db, 1, kills=5, rng=random.Random(0)) >= 3
    _check_equal(ref, _snapshot(db))
    with Store(db) as s:  # a diverged run is finished: a further sweep does not redo it
        nan = [r for r in s.runs("toy_sweep") if r["tags"]["design"] == "nan"][0]
        assert nan["status"] == "diverged" and 1 <= nan["step"] < 40 and nan["final"] == {}


@pytest.mark.slow
def test_sigkill_two_worker_sweep_then_rerun_equals_uninterrupted(tmp_path):
    ref = _reference(tmp_path, 2)
    db = tmp_path / "killed" / "qkvlab.db"
    assert _killed_then_finished(db, 2, kills=6, rng=random.Random(1)) >= 3
    _check_equal(ref, _snapshot(db))
    with Store(db) as s:  # workers died with their sweep: nothing left running
        assert {r["status"] for r in s.runs("toy_sweep")} == {"done", "diverged"}


@pytest.mark.slow
def test_two_concurrent_sweeps_share_runs_without_repeating(tmp_path):
    db = tmp_path / "qkvlab.db"
    procs = [_start(db, 1), _start(db, 1)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    with Store(db) as s:
        attempts = [r[0] for r in s.conn.execute("SELECT attempts FROM runs")]
        assert attempts == [1] * 5  # each run claimed exactly once
        assert s.counts()["runs"] == 5
