"""Issue 41, runs and their files under a kill or a full disk, one test per case: the study's
report is written as a set (1); a killed checkpoint save's temp file is never a checkpoint and
is removed (2); a non-finite or out-of-range number in a config is one line naming the field
(3); a store whose text is not UTF-8 is one line naming the row (4); a full disk mid-sweep
marks the run failed and ends the sweep in one line (5)."""

from __future__ import annotations

import errno
import math
import os
import sqlite3
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import toy_runs
from qkvlab.experiments import cli
from qkvlab.experiments.store import Store
from qkvlab.inputs import EnvironmentFailure, print_error
from test_train_trainer import spec as toy_spec


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- 1: the report is written as a set ----------------------------------------------------------
def test_a_report_that_fails_midway_leaves_the_old_report_whole(tmp_path, monkeypatch):
    from qkvlab.studies.qkv.compute import results
    from qkvlab.studies.qkv.render import page

    with Store(tmp_path / "r.db") as store:
        data = results.load(store, "smoke")
    out = tmp_path / "reports" / "smoke"
    (out / "figures").mkdir(parents=True)
    for name in ("index.html", "report.md", "verdicts.json", "comparisons.csv",
                 "figures/stale.png"):  # an older report, whole
        (out / name).write_text(f"old {name}")
    old = tree(out)

    def fail(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(page, "with_verdicts", fail)  # the CSV, written after index.html
    with pytest.raises(OSError, match="No space left"):
        page.write_report(data, out)
    assert tree(out) == old and os.listdir(out.parent) == ["smoke"]  # no partial folder left
    monkeypatch.undo()
    assert page.write_report(data, out) == out / "index.html"
    new = tree(out)  # the new report replaced the old folder whole: no stale figure
    assert set(new) == {"index.html", "report.md", "verdicts.json", "comparisons.csv",
                        "answers.json", "shares.csv", "uptrain.csv",
                        "head_width.csv"}
    assert all(new[k] != old.get(k) for k in new) and os.listdir(out.parent) == ["smoke"]


# ---- 2: a killed checkpoint save ----------------------------------------------------------------
def test_a_failed_or_killed_checkpoint_save_leaves_no_temp_file(tmp_path, monkeypatch):
    import safetensors.torch

    from qkvlab.train.checkpoints import read_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    path = save_checkpoint(tmp_path / "checkpoint.safetensors", model, None, step=1)
    saved = path.read_bytes()
    real = safetensors.torch.save_file

    def half_then_full(tensors, name, metadata=None):
        Path(name).write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", str(name))
    monkeypatch.setattr(safetensors.torch, "save_file", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model, None, step=2)
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"] and path.read_bytes() == saved
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    left = tmp_path / ".checkpoint.safetensors.0123456789ab.tmp"  # what a kill leaves
    left.touch()
    save_checkpoint(path, model, None, step=3)
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"]
    assert read_checkpoint(path)[1]["step"] == 3


def test_a_leftover_temp_file_is_not_resumed_and_is_removed(tmp_path):
    from qkvlab.train import run_from_spec

    clean = run_from_spec(toy_spec(checkpoint_every=4), run_dir=tmp_path / "a", progress=False)
    run_dir = tmp_path / "b"
    run_dir.mkdir()
    (run_dir / ".checkpoint.safetensors.0123456789ab.tmp").touch()  # killed before any rename
    (run_dir / ".model.safetensors.ba9876543210.tmp").write_bytes(b"half")
    again = run_from_spec(toy_spec(checkpoint_every=4), run_dir=run_dir, progress=False)
    assert (again.status, again.step, again.history) == (clean.status, clean.step, clean.history)
    assert sorted(os.listdir(run_dir)) == sorted(os.listdir(tmp_path / "a"))


# ---- 3: non-finite and out-of-range numbers in a config ----------------------------------------
@pytest.mark.parametrize("section, values, said", [
    ("model", {"dropout": math.nan}, "model.dropout: nan is not a finite number in [0, 1)"),
    ("model", {"attn_dropout": 1.0}, "model.attn_dropout: 1.0 is not a finite number in [0, 1)"),
    ("model", {"rope_base": 0.0}, "model.rope_base: 0.0 is not a finite number > 0"),
    ("model", {"init_std": math.inf}, "model.init_std: inf is not a finite number >= 0"),
    ("train", {"lr": math.nan}, "train.lr: nan is not a finite number >= 0"),
    ("train", {"beta2": 1.0}, "train.beta2: 1.0 is not a finite number in [0, 1)"),
    ("train", {"min_lr_ratio": -math.inf},
     "train.min_lr_ratio: -inf is not a finite number in [0, 1]"),
    ("train", {"keep_at": [0, math.nan]}, "train.keep_at: nan is not a step (a whole number >= 0)"),
    ("probe", {"sat": math.nan}, "probe.sat: nan is not a finite number in (0, 1)"),
    ("probe", {"steps": [-1]}, "probe.steps: -1 is not a step (a whole number >= 0)"),
])
def test_a_non_finite_or_out_of_range_number_is_refused_naming_its_field(section, values, said):
    from qkvlab.train import RunSpec

    with pytest.raises(ValueError) as e:
        RunSpec.from_dict({"task": "lm", section: values})
    assert str(e.value) == said


def test_the_configs_themselves_refuse_a_nan_dropout():
    from qkvlab.attention import AttentionConfig
    from qkvlab.models import ModelConfig

    for make in (lambda: ModelConfig(d_vocab=2, n_ctx=2, dropout=math.nan),
                 lambda: AttentionConfig(d_model=8, n_heads=2, dropout=math.nan)):
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == "dropout: nan is not a finite number in [0, 1)"


# ---- 4: a store whose text is not UTF-8 ----------------------------------------------------------
def test_text_that_is_not_utf8_is_one_line_naming_the_store_and_the_row(tmp_path, capsys):
    db = tmp_path / "r.db"
    with Store(db) as s:
        ids = s.add("toy", "smoke", toy_runs())
    with sqlite3.connect(db) as c:  # bytes that are no UTF-8, stored as TEXT
        c.execute("UPDATE runs SET error = CAST(? AS TEXT) WHERE id=?", (b"bad \xff", ids[1]))
    args = ["all", "--db", str(db), "--errors"]
    assert cli.run_results(_parser(cli.configure_results).parse_args(args)) == 2
    assert capsys.readouterr().err == (
        f"qkvlab results: error: db: {db}: table runs, row id '{ids[1]}', column error is not "
        f"UTF-8 text "
        "(invalid start byte at byte 4); the store is damaged or was changed by hand\n")
    with sqlite3.connect(db) as c:
        c.execute("UPDATE runs SET error = NULL, spec = CAST(? AS TEXT) WHERE id=?",
                  (b'{"task": "\xfe"}', ids[0]))
    with Store(db, readonly=True) as s, pytest.raises(ValueError) as e:
        s.runs_spec(ids[0])
    assert str(e.value) == (f"db: {db}: table runs, row id '{ids[0]}', column spec is not UTF-8 "
                            "text (invalid start byte at byte 10); the store is damaged or was "
                            "changed by hand")


def _parser(configure):
    import argparse

    p = argparse.ArgumentParser()
    configure(p)
    return p


# ---- 5: a full disk mid-sweep -------------------------------------------------------------------
def test_a_full_disk_fails_the_run_and_ends_the_sweep_in_one_line(tmp_path, monkeypatch, capsys):
    from qkvlab.experiments import pool
    from qkvlab.progress import bar
    from qkvlab.train import checkpoints

    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(path))
    monkeypatch.setattr(checkpoints, "atomic_write", full)
    db = tmp_path / "r.db"
    with Store(db) as s:
        ids = s.add("toy", "smoke", toy_runs(checkpoint_every=4))
        with pytest.raises(EnvironmentFailure) as e:
            pool.train_runs(s, ids, ids, "local", 1, 1, bar(total=2, disable=True), None)
        said = (f"sweep: no space left on device: {s.runs_dir / ids[0] / 'checkpoint.safetensors'}"
                f" (run {ids[0]} failed; a later sweep retries it)")
        assert str(e.value) == said
        assert [s.status(i) for i in ids] == ["failed", "pending"]  # nothing left "running"
        assert "OSError: [Errno 28] No space left on device" in s.error(ids[0])
    assert print_error("qkvlab sweep", e.value) == 1
    assert capsys.readouterr().err == f"qkvlab sweep: error: {said}\n"
    monkeypatch.undo()  # space again: the next sweep retries the failed run
    with Store(db) as s:
        pool.train_runs(s, ids, ids, "local", 1, 1, bar(total=2, disable=True), None)
        assert [s.status(i) for i in ids] == ["done", "done"]


def test_the_causes_that_stop_a_sweep_are_named_with_their_path(tmp_path):
    from qkvlab.experiments.worker import no_space

    quota = OSError(errno.EDQUOT, "Disk quota exceeded", "/data/x.tmp")
    full_store = sqlite3.OperationalError("database or disk is full")
    full_store.sqlite_errorcode = sqlite3.SQLITE_FULL
    wrapped = RuntimeError("while saving")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert [no_space(e, tmp_path / "run", tmp_path / "r.db") for e in
            (quota, full_store, wrapped, OSError(errno.ENOENT, "gone"), ValueError("bad"))] == [
        "disk quota exceeded: /data/x.tmp", f"no space left on device: {tmp_path / 'r.db'}",
        f"no space left on device: {tmp_path / 'run'}", None, None]
