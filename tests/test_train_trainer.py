"""Trainer: determinism, resume equality, divergence, schedule, optimizer groups, bf16, probe.

``ToyTask`` (also used by the experiment tests, as ``test_train_trainer:ToyTask``) is a tiny
synthetic decoder task: predict the token two positions back, which needs attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from qkvlab.data.base import IGNORE, Task
from qkvlab.experiments.probe import ScaleProbe, row_stats
from qkvlab.models import ModelConfig
from qkvlab.train import (TrainConfig, build_seeded, lr_at, make_optimizer, make_task,
                          run_from_spec, train)
from qkvlab.train.trainer import adamw_kernel

TOY = "test_train_trainer:ToyTask"
TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2}


@dataclass(frozen=True)
class ToyTask(Task):
    name: ClassVar[str] = "toy"
    version: ClassVar[int] = 1
    seq_len: int = 12
    vocab: int = 11

    @property
    def d_vocab(self) -> int:
        return self.vocab

    def batch(self, split, batch_size, generator):
        idx = torch.randint(0, self.vocab, (batch_size, self.seq_len), generator=generator)
        targets = torch.full_like(idx, IGNORE)
        targets[:, 2:] = idx[:, :-2]
        return {"idx": idx, "targets": targets}


def spec(**train) -> dict:
    return {"task": TOY, "model": dict(TINY), "train": {"steps": 8, "batch_size": 4,
                                                         "eval_batches": 1, "eval_batch_size": 4,
                                                         "log_every": 2, "eval_every": 4, **train}}


def test_same_seed_bit_identical_and_other_seed_differs():
    a = run_from_spec(spec(seed=3), progress=False)
    b = run_from_spec(spec(seed=3), progress=False)
    c = run_from_spec(spec(seed=4), progress=False)
    assert a.status == b.status == "done" and a.step == 8
    assert a.history == b.history  # every logged float equal, not merely close
    assert a.final == b.final and set(a.final) == {"train_loss", "val_loss", "accuracy"}
    assert a.final["val_loss"] != c.final["val_loss"]


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path):
    full = run_from_spec(spec(seed=1), progress=False)
    # first attempt: checkpoint every 3 steps, stop after step 6 (as if killed after it)
    task = make_task(TOY)
    cfg = TrainConfig(**{**spec(seed=1)["train"], "checkpoint_every": 3})
    cfg_cut = TrainConfig(**{**cfg.to_dict(), "steps": 8})
    model = build_seeded(ModelConfig(d_vocab=11, n_ctx=12, **TINY), "decoder", 1)

    class Kill(Exception):
        pass

    class Stop:
        def after_backward(self, step, model, batch):
            if step == 7:
                raise Kill

    with pytest.raises(Kill):
        train(model, task, cfg_cut, run_dir=tmp_path, callback=Stop(), progress=False)
    assert (tmp_path / "checkpoint.safetensors").exists()
    resumed = run_from_spec({**spec(seed=1), "train": cfg.to_dict()}, run_dir=tmp_path,
                            progress=False)
    assert resumed.history == full.history
    assert resumed.final == full.final
    assert (tmp_path / "model.safetensors").exists()


def test_nan_ends_run_as_diverged_with_its_step():
    # lr 1e30: AdamW moves every weight by ~1e30 in one step, so products overflow at once
    res = run_from_spec(spec(lr=1e30, warmup=0, grad_clip=0.0), progress=False)
    assert res.status == "diverged"
    assert 1 <= res.step < 8 and res.final == {}
    assert not math.isfinite(res.history[-1]["train_loss"] * res.history[-1]["grad_norm"])


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(steps=110, lr=1.0, warmup=10, min_lr_ratio=0.1)
    got = torch.tensor([lr_at(s, cfg) for s in (0, 4, 9, 10, 60, 110)])
    want = torch.tensor([0.1, 0.5, 1.0, 1.0, 0.55, 0.1])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12, check_dtype=False)


def test_weight_decay_on_matrices_only():
    model = build_seeded(ModelConfig(d_vocab=11, n_ctx=12, **TINY), "decoder", 0)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.2))
    decay, rest = opt.param_groups
    assert (decay["weight_decay"], rest["weight_decay"]) == (0.2, 0.0)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in rest["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_adamw_runs_the_loop_on_cpu_and_the_fused_kernel_on_cuda():
    model = build_seeded(ModelConfig(d_vocab=11, n_ctx=12, **TINY), "decoder", 0)
    opt = make_optimizer(model, TrainConfig())
    assert opt.defaults["foreach"] is False and not opt.defaults["fused"]  # stored runs' path
    assert adamw_kernel("cpu") == {"foreach": False}
    assert adamw_kernel("cuda") == adamw_kernel(torch.device("cuda", 1)) == {"fused": True}


@pytest.mark.filterwarnings("ignore::qkvlab.train.precision.SlowPrecisionWarning")
def test_bf16_autocast_trains_close_to_fp32():
    a = run_from_spec(spec(seed=2), progress=False)
    b = run_from_spec(spec(seed=2, precision="bf16_force"), progress=False)  # bf16 on any CPU
    assert b.status == "done" and b.precision_used == "bf16"
    assert a.final["val_loss"] == pytest.approx(b.final["val_loss"], rel=0.05)


@pytest.mark.parametrize("field,value,match", [
    ("steps", 0, "steps"), ("precision", "fp8", "precision"), ("lr", float("nan"), "lr"),
    ("warmup", -1, "warmup"), ("bogus", 1, "train.bogus")])
def test_bad_train_config_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        run_from_spec(spec(**{field: value}), progress=False)


@pytest.mark.parametrize("bad,match", [
    ({"tsk": "lm"}, "^tsk: unknown key"), ({"model": {"n_heads": 0}}, "n_heads"),
    ({"task": "no_such_module:X"}, "task"), ({"init": {"qk": "huge"}}, "init.qk")])
def test_malformed_spec_gives_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        run_from_spec({**spec(), **bad}, progress=False)


def test_a_spec_naming_a_callable_that_is_not_a_task_is_refused_before_it_runs(tmp_path):
    """A spec file or a store is data: ``os:system`` must not become a shell command."""
    target = tmp_path / "ran"
    bad = {**spec(), "task": "os:system", "task_options": {"command": f"touch {target}"}}
    with pytest.raises(ValueError, match="'os:system' names code to import, which qkvlab runs "
                                         "only from a module you name: --task-module os"):
        run_from_spec(bad, progress=False)  # not imported: nobody opted in to module os
    with pytest.raises(ValueError, match="'os:system' is not a task class"):
        make_task("os:system", {"command": f"touch {target}"}, task_modules=("os",))
    assert not target.exists()


def test_row_stats_on_known_weights():
    # causal (1 query row per key count): row 0 dropped; row 1 uniform over 2; row 2 one-hot
    w = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.0, 0.0, 1.0]])[None, None]
    st = row_stats(w, causal=True, sat=0.99)
    assert st["entropy"] == pytest.approx(math.log(2) / 2)
    assert st["norm_entropy"] == pytest.approx(0.5)
    assert st["saturated"] == pytest.approx(0.5)


def test_probe_records_init_stats_and_grads_of_wq_wk():
    model = build_seeded(ModelConfig(d_vocab=11, n_ctx=12, **TINY), "decoder", 0)
    probe = ScaleProbe(model, steps=[0, 2])
    res = train(model, make_task(TOY), TrainConfig(steps=3, batch_size=4, eval_batch_size=4,
                                                   eval_batches=1), callback=probe, progress=False)
    at = {r["step"]: r for r in res.history if "probe/entropy" in r}
    assert sorted(at) == [0, 2]
    # GPT-2 init (std 0.02): scores ~0, so rows start near uniform and unsaturated
    assert at[0]["probe/norm_entropy"] == pytest.approx(1.0, abs=1e-3)
    assert at[0]["probe/saturated"] == 0.0
    assert at[0]["probe/0.attn/grad_WQ"] > 0 and at[0]["probe/0.attn/grad_WK"] > 0


@pytest.mark.slow
def test_compiled_training_follows_eager_training():
    """train.compile=True (torch.compile of the forward) trains the same model: the loss
    history agrees with eager training to float32 rounding (kernels may sum in another order)."""
    eager = run_from_spec(spec(seed=2), progress=False)
    compiled = run_from_spec(spec(seed=2, compile=True), progress=False)
    assert compiled.status == "done" and compiled.step == 8
    a = torch.tensor([h.get("train_loss", math.nan) for h in eager.history], dtype=torch.float64)
    b = torch.tensor([h.get("train_loss", math.nan) for h in compiled.history], dtype=torch.float64)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, equal_nan=True)
