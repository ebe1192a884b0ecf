"""The typed run spec and the tidy results: dict round trips with one error format, measures
stored as JSON records next to their run, and the runs/measures frames the report reads."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from qkvlab.experiments.frames import measures_frame, runs_frame
from qkvlab.experiments.registry import runs_of
from qkvlab.experiments.store import Store, run_id
from qkvlab.train import InitConfig, ProbeConfig, RunSpec, TrainConfig


def test_run_spec_round_trip_is_canonical():
    spec = RunSpec.from_dict({"task": "lm", "model": {"design": "tied_kv", "d_model": 32},
                              "train": {"steps": 5, "keep_at": [0, 5]},
                              "probe": {"steps": [0, 2]}, "init": {"qk": "unit"}})
    assert spec.train == TrainConfig(steps=5, keep_at=(0, 5))
    assert (spec.probe, spec.init) == (ProbeConfig(steps=(0, 2)), InitConfig(qk="unit"))
    d = spec.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON
    assert RunSpec.from_dict(d) == spec and RunSpec.from_dict(d).to_dict() == d
    # defaults are written out, so a spec and its explicit twin hash alike
    assert run_id(RunSpec(task="lm").to_dict()) == run_id(
        RunSpec.from_dict({"task": "lm", "train": TrainConfig().to_dict()}).to_dict())


@pytest.mark.parametrize(("bad", "message"), [
    ({"task": "lm", "trian": {}}, r"^trian: unknown key; allowed: \['from_run', 'init', 'kind'"),
    ({"task": "lm", "train": {"stpes": 3}}, r"^train.stpes: unknown key; allowed: \['batch_size'"),
    ({"task": "lm", "model": {"d_modle": 3}}, r"^model.d_modle: unknown key; allowed: \["),
    ({"task": "lm", "probe": {"step": [1]}}, r"^probe.step: unknown key; allowed: \['sat', 'steps'\]"),
    ({"task": "lm", "init": {"kq": "unit"}}, r"^init.kq: unknown key; allowed: \['qk'\]"),
    ({"task": "lm", "init": {"qk": "xavier"}}, r"^init.qk: 'xavier' is not one of"),
    ({"task": "lm", "train": {"steps": 0}}, r"^train.steps: 0 must be a positive integer"),
    ({"task": "lm", "kind": "seq2seq"}, r"^kind: 'seq2seq' is not one of"),
    ({"task": "lm", "train": [1, 2]}, r"^train: list must be a mapping"),
])
def test_run_spec_rejects_bad_input_naming_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        RunSpec.from_dict(bad)


def test_study_experiments_build_typed_specs():
    runs = runs_of("scale_probe", "smoke")
    spec, tags = runs[0]
    assert isinstance(spec, RunSpec) and spec.init == InitConfig(qk="unit")
    assert spec.probe.steps == (0, 1, 2, 3) and tags["design"] == "inside"


def test_measures_are_json_records_next_to_their_run(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return [{"design": "a", "value": 1.5}, {"design": "b", "value": 2.0}]

    with Store(tmp_path / "r.db") as s:
        rid, = s.add("exp", "quick", [({"task": "lm"}, {"design": "standard", "seed": 0})])
        spec = {"profile": "quick", "n": 3}
        got = s.measure("speed", spec, compute, run=rid, env={"cpu": "x"})
        again = s.measure("speed", spec, compute, run=rid)
        assert got == again == compute()[:2] and len(calls) == 2  # second call read the store
        df = measures_frame(s, "speed")
        assert df[["run_id", "spec.profile", "spec.n", "design", "value"]].values.tolist() == [
            [rid, "quick", 3, "a", 1.5], [rid, "quick", 3, "b", 2.0]]
        with pytest.raises(ValueError, match="measure broken failed: ZeroDivisionError"):
            s.measure("broken", spec, lambda: 1 / 0)
        row = s.conn.execute("SELECT status, error FROM measures WHERE name='broken'").fetchone()
        assert row["status"] == "failed" and "ZeroDivisionError" in row["error"]
        with pytest.raises(ValueError, match="not JSON serializable"):
            s.measure("bad", spec, lambda: {"x": object()})
        assert measures_frame(s, "broken").empty and s.check() == "ok"


def test_a_measure_held_by_a_live_process_is_not_computed_twice(tmp_path):
    with Store(tmp_path / "r.db") as s:
        mid = run_id({"measure": "m", "profile": "quick"})
        s.conn.execute("INSERT INTO measures (id, name, spec, status, host, pid) VALUES "
                       "(?, 'm', '{}', 'running', ?, ?)", (mid, os.uname().nodename, os.getppid()))
        with pytest.raises(ValueError, match="being computed by process"):
            s.measure("m", {"profile": "quick"}, lambda: {"x": 1})


def test_runs_frame_flattens_tags_metrics_params_and_spec(tmp_path):
    spec = RunSpec.from_dict({"task": "lm", "task_options": {"seq_len": 16},
                              "model": {"d_model": 32}})
    with Store(tmp_path / "r.db") as s:
        rid, = s.add("exp", "quick", [(spec, {"design": "standard", "seed": 0, "arm": "equal"})])
        s.claim(rid)
        s.finish(rid, "done", 7, {"val_loss": 1.25, "accuracy": 0.5},
                 {"n_params": 99, "params": {"attention": 12, "total": 99}})
        df = runs_frame(s)
    row = df.iloc[0]
    assert (row.experiment, row.run_id, row.design, row.arm, row.seed) == ("exp", rid,
                                                                          "standard", "equal", 0)
    assert (row.val_loss, row.accuracy, row["params.attention"], row.n_params) == (1.25, 0.5, 12, 99)
    assert (row["spec.task_options.seq_len"], row["spec.model.d_model"],
            row["spec.train.steps"]) == (16, 32, 200)
    assert not any(isinstance(c, str) and "/" in c for c in df.columns)
    assert isinstance(df, pd.DataFrame)
