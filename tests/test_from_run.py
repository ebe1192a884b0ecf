"""A run that starts from another run's trained model (``RunSpec.from_run``, the controlled
conversion): the ids of runs without it stand, the start is the parent's final weights (tied
K = V exactly as ``models.tie`` ties them), and what cannot start is refused in one line."""

import json

import pytest
import torch

from qkvlab.experiments.ids import canonical, run_id
from qkvlab.experiments.worker import execute
from qkvlab.models import load_model
from qkvlab.models.tie import tie_kv
from qkvlab.train import RunSpec, make_task, start_from
from qkvlab.train.trainer import FINAL_MODEL

TASK = {"task": "lm_char", "task_options": {"seq_len": 16}}
MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 4}


def parent_spec(steps=6) -> RunSpec:
    return RunSpec.from_dict({**TASK, "model": MODEL,
                              "train": {"steps": steps, "batch_size": 4, "warmup": 1,
                                        "eval_batches": 1, "eval_batch_size": 4}})


def child_spec(parent: RunSpec, tie="kv", start="fitted", design="tied_kv", **task) -> RunSpec:
    return RunSpec.from_dict({**TASK, **task, "model": {**MODEL, "design": design},
                              "train": {"steps": 2, "batch_size": 4, "warmup": 1,
                                        "eval_batches": 1, "eval_batch_size": 4, "seed": 7},
                              "from_run": {"spec": parent.to_dict(), "tie": tie,
                                           "start": start}})


def test_a_spec_without_from_run_hashes_as_before():
    spec = parent_spec()
    d = spec.to_dict()
    assert "from_run" not in d
    assert set(d) == {"task", "task_version", "task_options", "kind", "model", "train", "probe",
                      "init"}
    assert RunSpec.from_dict(d) == spec and run_id(spec) == run_id(json.loads(canonical(d)))


def test_the_child_id_hashes_its_parent_and_its_start():
    p = parent_spec()
    ids = {run_id(child_spec(p, start=s)) for s in ("fitted", "avg", "keep_k")}
    ids.add(run_id(child_spec(parent_spec(steps=7))))
    assert len(ids) == 4
    assert RunSpec.from_dict(child_spec(p).to_dict()) == child_spec(p)


@pytest.mark.parametrize("bad, msg", [
    ({"tie": "qk", "start": "fitted"}, "from_run.tie: 'qk'"),
    ({"tie": "kv", "start": None}, "from_run.start: None"),
    ({"tie": "kv", "start": "mean"}, "from_run.start: 'mean'"),
    ({"tie": "none", "start": "avg"}, "from_run.start: 'avg' needs a tie"),
    ({"tie": "kv", "start": "avg", "calib_batches": 0}, "from_run.calib_batches: 0"),
])
def test_a_bad_from_run_is_refused_naming_the_field(bad, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        RunSpec.from_dict({**TASK, "from_run": {"spec": parent_spec().to_dict(), **bad}})


def test_a_chain_of_conversions_is_refused():
    child = child_spec(parent_spec())
    with pytest.raises(ValueError, match="a chain of conversions"):
        child_spec(child)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A parent run trained through the worker, in a runs folder as a store keeps it."""
    runs = tmp_path_factory.mktemp("runs")
    p = parent_spec()
    out = execute(p, runs / run_id(p))
    assert out["status"] == "done"
    return runs, p


def test_the_start_is_the_parents_final_model_tied_as_models_tie_ties_it(trained):
    runs, p = trained
    path = runs / run_id(p) / FINAL_MODEL
    task = make_task(TASK["task"], TASK["task_options"])
    parent = load_model(path)
    kept = start_from(child_spec(p, tie="none", start=None, design="standard"), task, path)
    want = parent.state_dict()
    assert kept.state_dict().keys() == want.keys()
    for k, v in kept.state_dict().items():
        assert torch.equal(v, want[k]), k
    for start in ("fitted", "avg", "keep_k"):
        gen = torch.Generator().manual_seed(7)  # the child's seed draws its calibration
        batches = [task.batch("train", 4, gen)["idx"] for _ in range(4)]
        ref = tie_kv(load_model(path), batches, start).state_dict()
        got = start_from(child_spec(p, start=start), task, path).state_dict()
        assert got.keys() == ref.keys()
        for k, v in got.items():
            assert torch.equal(v, ref[k]), (start, k)


def test_a_child_trains_through_the_worker_from_its_sibling_folder(trained):
    runs, p = trained
    c = child_spec(p, start="avg")
    out = execute(c, runs / run_id(c))
    assert out["status"] == "done" and out["step"] == 2
    saved = json.loads((runs / run_id(c) / "config.json").read_text())
    assert saved["from_run"]["spec"] == p.to_dict() and saved["from_run"]["start"] == "avg"
    assert load_model(runs / run_id(c) / FINAL_MODEL).cfg.design == "tied_kv"


def test_what_cannot_start_is_refused_in_one_line(trained, tmp_path):
    runs, p = trained
    path = runs / run_id(p) / FINAL_MODEL
    task = make_task(TASK["task"], TASK["task_options"])
    with pytest.raises(ValueError, match="train the parent run first"):
        start_from(child_spec(p), task, tmp_path / "absent.safetensors")
    with pytest.raises(ValueError, match=r"differs in \['design'\]"):
        start_from(child_spec(p, design="standard"), task, path)
    other = child_spec(p, task_options={"seq_len": 8})
    with pytest.raises(ValueError, match="a conversion keeps the task"):
        start_from(other, make_task("lm_char", {"seq_len": 8}), path)
