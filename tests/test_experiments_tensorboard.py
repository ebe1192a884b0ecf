"""``sweep(..., tensorboard=DIR)``: every metric a run stores is also in its TensorBoard events,
at the same step (to float32, TensorBoard's precision); a missing package is one clear error."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qkvlab.experiments.runner import sweep
from conftest import temporary_experiment, toy_runs

from qkvlab.experiments.store import Store
from qkvlab.experiments.tensorboard import run_name

NAME = "toy_tensorboard"


@pytest.fixture
def toy_experiment():
    with temporary_experiment(NAME, toy_runs()) as name:
        yield name


def _events(log_dir) -> dict[tuple[int, str], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def test_sweep_logs_every_stored_metric(tmp_path, toy_experiment):
    db, tb = tmp_path / "q.db", tmp_path / "tb"
    counts = sweep(toy_experiment, "smoke", db=db, progress=False, threads=1, tensorboard=tb)
    assert counts == {"done": 2}
    with Store(db) as s:
        runs = s.runs(toy_experiment)
        assert {run_name(r["id"], r["spec"]) for r in runs} == {p.name for p in tb.iterdir()}
        for r in runs:
            stored = {(step, name): value for _, step, name, value in s.conn.execute(
                "SELECT run_id, step, name, value FROM metrics WHERE run_id=?", (r["id"],))}
            logged = _events(tb / run_name(r["id"], r["spec"]))
            assert {"train_loss", "val_loss"} <= {name for _, name in stored}
            assert logged.keys() == stored.keys()
            keys = sorted(stored)
            np.testing.assert_array_equal(np.array([logged[k] for k in keys], dtype=np.float32),
                                          np.array([stored[k] for k in keys], dtype=np.float32))


def test_missing_tensorboard_is_one_clear_error(tmp_path, toy_experiment, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with pytest.raises(ValueError, match=r"tensorboard.*pip install 'qkvlab\[tensorboard\]'"):
        sweep(toy_experiment, "smoke", db=tmp_path / "q.db", progress=False,
              tensorboard=tmp_path / "tb")
    assert not (tmp_path / "q.db").exists() and not (tmp_path / "tb").exists()
