"""DDP under torchrun: 2 CPU processes (gloo) give the loss of 1 process with the same global
batch. Slow (two process groups start, ~20-40 s on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkvlab.train import DistInfo
from qkvlab.train.distributed import shard

TESTS = Path(__file__).resolve().parent
SPEC = {"task": "test_train_trainer:ToyTask", "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
        "train": {"steps": 6, "batch_size": 8, "log_every": 1, "eval_batches": 1,
                  "eval_batch_size": 4, "test_batches": 2, "seed": 5}}


def _torchrun(tmp_path: Path, nproc: int) -> dict:
    spec, out = tmp_path / "spec.json", tmp_path / f"out{nproc}.json"
    spec.write_text(json.dumps(SPEC))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "qkvlab.train", str(spec), "--out", str(out),
           "--task-module", "test_train_trainer"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_same_global_batch(tmp_path):
    one, two = _torchrun(tmp_path, 1), _torchrun(tmp_path, 2)
    l1 = torch.tensor([r["train_loss"] for r in one["history"] if "train_loss" in r])
    l2 = torch.tensor([r["train_loss"] for r in two["history"] if "train_loss" in r])
    assert len(l1) == 6
    # same batches, gradients averaged over halves = gradient of the mean: equal up to fp32 sums
    torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-6)
    assert two["final"]["val_loss"] == pytest.approx(one["final"]["val_loss"], rel=1e-5)
    # the test split is scored on every rank, like val; rank 0's numbers are the run's
    assert two["final"]["test_val_loss"] == pytest.approx(one["final"]["test_val_loss"],
                                                          rel=1e-5)
    assert two["final"]["test_val_loss"] != two["final"]["val_loss"]
    assert one["tokens"] == two["tokens"] == 6 * 8 * 12


def test_shard_gives_contiguous_equal_slices_and_rejects_uneven_batches():
    b = {"idx": torch.arange(12).view(6, 2), "n": torch.tensor(3)}
    parts = [shard(b, DistInfo(rank=r, world=3)) for r in range(3)]
    torch.testing.assert_close(torch.cat([p["idx"] for p in parts]), b["idx"])
    assert all(p["n"] is b["n"] for p in parts)
    with pytest.raises(ValueError, match="batch_size: 6 is not divisible"):
        shard(b, DistInfo(rank=0, world=4))


def test_entry_point_trains_one_process_and_distributed_does_not_import_the_trainer(tmp_path):
    import ast

    from qkvlab.train import distributed
    from qkvlab.train.__main__ import main

    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    spec.write_text(json.dumps(SPEC))
    assert main([str(spec), "--out", str(out)]) == 0  # no torchrun: one process
    assert len([r for r in json.loads(out.read_text())["history"] if "train_loss" in r]) == 6
    tree = ast.parse(Path(distributed.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in mods if m and m.startswith("qkvlab")}  # one-way: trainer -> distributed
