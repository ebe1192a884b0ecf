"""The trainer: AdamW + warmup/cosine + clipping, periodic eval, resumable, deterministic on CPU.

One function, :func:`train`, takes a built model and a task (``qkvlab.data`` interface:
``batch(split, batch_size, generator)``, ``loss(model, batch)``,
``evaluate(model, generator, n_batches, batch_size)``). Determinism: the training batches come
from one ``torch.Generator`` seeded by the run seed, evaluation always redraws the same
validation batches from a second one, and both generators plus torch's global RNG (dropout) are
checkpointed, so a killed and resumed run reproduces the uninterrupted one bit for bit on CPU.
A non-finite loss or gradient ends the run as ``diverged`` at that step. A run that finished
is scored once more on the held-out ``test`` split (``TrainConfig.test_batches``, from a third
generator), after the last step, so it cannot change training.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkvlab.models import save_model
from qkvlab.progress import bar as progress_bar
from qkvlab.train.build import (
    apply_init,
    apply_input_codes,
    build_seeded,
    make_task,
    model_config,
    start_from,
)
from qkvlab.train.checkpoints import discard_temp_files, load_checkpoint, save_checkpoint
from qkvlab.train.config import RunSpec, TrainConfig
from qkvlab.train.distributed import DistInfo, mean_across, shard, wrap
from qkvlab.train.precision import autocast, resolve_precision

CHECKPOINT = "checkpoint.safetensors"
FINAL_MODEL = "model.safetensors"
EVAL_SEED_OFFSET = 1_000_003  # the validation generator's seed, apart from the training seed
# The test generator's: apart from both, so a synthetic task (whose split only names its
# stream) draws test samples other than the validation ones.
TEST_SEED_OFFSET = 2_000_029
# Where a run's time goes (TrainResult.timings, seconds): ``data`` draws batches, ``step`` is
# forward + backward + clipping + the optimizer step, ``eval`` the evaluations, ``checkpoint``
# the resumable checkpoints and kept/final models, ``log`` on_log, the probe callback and the
# progress bar, ``setup`` task preparation, model build and init, optimizer (and a resume).
TIMING_PARTS = ("step", "data", "eval", "checkpoint", "log", "setup")


@dataclass
class TrainResult:
    """What a run produced. ``status`` is ``done`` or ``diverged`` (then ``step`` is where).

    ``train_s`` is the time of the training steps over all attempts (it resumes from the
    checkpoint; ``tokens_per_s`` divides by it). ``timings`` says where this attempt's time
    went, in seconds per part (:data:`TIMING_PARTS`); a resumed run counts only its last attempt.
    ``precision_used`` is the precision it trained in (``fp32`` or ``bf16``), which differs from
    ``TrainConfig.precision`` where bf16 fell back to fp32 (``qkvlab.train.precision``).
    """

    status: str
    step: int
    final: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    tokens: int = 0
    train_s: float = 0.0
    precision_used: str = "fp32"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s if self.train_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokens_per_s"] = self.tokens_per_s
        return d


class Stopwatch:
    """Seconds per part of a run: ``lap(part)`` charges the time since the previous lap (or
    since the stopwatch started) to ``part``, so the parts add up to the time it ran."""

    def __init__(self) -> None:
        self.s = dict.fromkeys(TIMING_PARTS, 0.0)
        self._t = time.perf_counter()

    def lap(self, part: str) -> None:
        t = time.perf_counter()
        self.s[part] += t - self._t
        self._t = t


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + 0.5 * (cfg.lr - lo) * (1.0 + math.cos(math.pi * frac))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (dim >= 2) only; biases and LayerNorm gains are not
    decayed, since shrinking them toward 0 has no regularizing meaning (nanoGPT does the same)."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied tensors once
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    device = params[0].device if params else "cpu"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             **adamw_kernel(device))


def adamw_kernel(device) -> dict[str, bool]:
    """AdamW's implementation on ``device``: on CUDA the fused kernel (one launch for every
    parameter, where the per-parameter loop would launch several per tensor); elsewhere the loop
    (``foreach=False``), one code path whatever the parameter count, for reproducible sums.
    Every stored CPU run trained with the loop: the fused CPU kernel is ~7% faster there but not
    bit-identical, so it would change their results."""
    return {"fused": True} if torch.device(device).type == "cuda" else {"foreach": False}


def _count_tokens(batch: Mapping[str, Tensor]) -> int:
    """Tokens of a batch: the largest integer tensor (inputs and targets count once)."""
    sizes = [t.numel() for t in batch.values()
             if isinstance(t, Tensor) and not t.is_floating_point() and t.dtype != torch.bool]
    return max(sizes, default=0)


def evaluate(model: nn.Module, task, cfg: TrainConfig, device: str = "cpu", *,
             split: str = "val") -> dict[str, float]:
    """The task's metrics on the same batches of ``split`` every time, in the precision training
    uses (``resolve_precision(cfg.precision, device)``): ``val``, ``cfg.eval_batches`` batches
    from the seed ``cfg.seed + EVAL_SEED_OFFSET``; ``test``, ``cfg.test_batches`` batches from
    ``cfg.seed + TEST_SEED_OFFSET``; ``eval_batch_size`` sequences each."""
    if split not in ("val", "test"):
        raise ValueError(f"split: {split!r} is not one of ['val', 'test']")
    offset, n = ((EVAL_SEED_OFFSET, cfg.eval_batches) if split == "val"
                 else (TEST_SEED_OFFSET, cfg.test_batches))
    gen = torch.Generator().manual_seed(cfg.seed + offset)
    used = resolve_precision(cfg.precision, device)
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast(used, device):
            # a user's own task may know no split argument: val is every task's default
            kw = {} if split == "val" else {"split": split}
            out = task.evaluate(model, gen, n, cfg.eval_batch_size, **kw)
    finally:
        model.train(was)
    return {k: float(v) for k, v in out.items()}


def train(model: nn.Module, task, cfg: TrainConfig, *, run_dir: str | Path | None = None,
          on_log: Callable[[int, dict[str, float]], None] | None = None,
          callback=None, dist_info: DistInfo | None = None, progress: bool = True,
          desc: str = "train") -> TrainResult:
    """Train ``model`` on ``task`` for ``cfg.steps`` AdamW steps (resuming from ``run_dir``).

    Args:
        model: built and initialized by the caller (so the seed governs the init).
        run_dir: checkpoints go here; an existing ``checkpoint.safetensors`` is resumed.
        on_log: called as ``on_log(step, metrics)`` for every logged/evaluated step.
        callback: optional object with ``after_backward(step, model, batch) -> dict | None``
            and optionally ``before_step(step)`` (e.g. the scale probe); the metrics it
            returns are logged at that step.
        dist_info: from ``qkvlab.train.distributed.setup()`` under torchrun.

    Returns:
        TrainResult; ``status == "diverged"`` if a loss or gradient norm became NaN/inf.
        ``final`` holds the last logged value of each metric, and for a finished run with
        ``cfg.test_batches`` its test split's metrics as ``test_<metric>``.
        ``precision_used``: bf16 falls back to fp32, with a warning, on a CPU without native
        bf16 (``qkvlab.train.precision.resolve_precision``).
    """
    watch = Stopwatch()
    info = dist_info or DistInfo()
    device = info.device
    used = resolve_precision(cfg.precision, device)  # before any RNG draw; warns once
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir = Path(run_dir) if run_dir is not None else None
    start, history, tokens, train_s = 0, [], 0, 0.0
    if run_dir is not None and info.main:  # a killed save's temp file is never a checkpoint
        discard_temp_files(run_dir)
    if run_dir is not None and (run_dir / CHECKPOINT).exists():
        ck = load_checkpoint(run_dir / CHECKPOINT, model, opt)
        start, st = ck["step"], ck["state"]
        history, tokens, train_s = st["history"], st["tokens"], st["train_s"]
        gen.set_state(ck["rng"]["data"])
        torch.set_rng_state(ck["rng"]["torch"])
    fwd = wrap(model, info)
    if cfg.compile:
        fwd = torch.compile(fwd)

    def log(step: int, metrics: dict[str, float]) -> None:
        history.append({"step": step, **metrics})
        if on_log is not None and info.main:
            on_log(step, metrics)

    def checkpoint(step: int) -> None:
        if run_dir is not None and info.main:
            save_checkpoint(run_dir / CHECKPOINT, model, opt, step=step,
                            rng={"data": gen.get_state(), "torch": torch.get_rng_state()},
                            state={"history": history, "tokens": tokens, "train_s": train_s})

    watch.lap("setup")  # the optimizer, a resume from the checkpoint
    if start == 0 and 0 in cfg.keep_at and run_dir is not None and info.main:
        save_model(model, run_dir / "model_step0.safetensors")  # the initial weights
        watch.lap("checkpoint")
    bar = progress_bar(total=cfg.steps, initial=start, desc=desc, leave=False,
                       disable=not (progress and info.main), dynamic_ncols=True)
    status, step = "done", start
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            if callback is not None and hasattr(callback, "before_step"):
                callback.before_step(step)
            watch.lap("log")
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            batch = task.batch("train", cfg.batch_size, gen)  # the global batch, on every rank
            tokens += _count_tokens(batch)
            local = {k: v.to(device) if isinstance(v, Tensor) else v
                     for k, v in shard(batch, info).items()}
            watch.lap("data")
            with autocast(used, device):
                loss = task.loss(fwd, local)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            watch.lap("step")
            extra = callback.after_backward(step, model, local) if callback is not None else None
            watch.lap("log")
            gnorm = nn.utils.clip_grad_norm_(model.parameters(),
                                             cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            loss_all = mean_across(loss.detach().float(), info)
            if not (math.isfinite(loss_all.item()) and math.isfinite(gnorm.item())):
                status = "diverged"
                watch.lap("step")
                log(step, {"train_loss": loss_all.item(), "grad_norm": gnorm.item()})
                watch.lap("log")
                break
            opt.step()
            train_s += time.perf_counter() - t0
            watch.lap("step")
            done = step + 1
            if extra:  # measured on the weights before this step's update: logged at `step`
                log(step, dict(extra))
            metrics: dict[str, float] = {}
            if done % cfg.log_every == 0 or done == cfg.steps or step == 0:
                metrics.update(train_loss=loss_all.item(), grad_norm=gnorm.item(),
                               lr=lr_at(step, cfg))
            watch.lap("log")
            if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
                metrics.update(evaluate(model, task, cfg, device))
                watch.lap("eval")
            if metrics:
                log(done, metrics)
                watch.lap("log")
            if done in cfg.keep_at and run_dir is not None and info.main:
                save_model(model, run_dir / f"model_step{done}.safetensors")
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
                checkpoint(done)
            watch.lap("checkpoint")
            bar.update(1)
            if "train_loss" in metrics:
                bar.set_postfix(loss=f"{metrics['train_loss']:.3f}")
        else:
            step = cfg.steps
    finally:
        bar.close()
        watch.lap("log")
    final: dict[str, float] = {}
    if status == "done":
        last = {}
        for rec in history:
            last.update({k: v for k, v in rec.items() if k != "step"})
        # probe series stay in the per-step metrics; final holds the run's outcome only
        final = {k: v for k, v in last.items()
                 if k not in ("lr", "grad_norm") and not k.startswith("probe/")}
        if cfg.test_batches:  # on every rank, like the validation evaluations
            test = evaluate(model, task, cfg, device, split="test")
            final.update({f"test_{k}": v for k, v in test.items()})
            watch.lap("eval")
    return TrainResult(status=status, step=step, final=final, history=history, tokens=tokens,
                       train_s=train_s, precision_used=used, timings=watch.s)


def run_from_spec(spec: RunSpec | Mapping[str, Any], *, run_dir: str | Path | None = None,
                  dist_info: DistInfo | None = None, on_log=None, callback_factory=None,
                  progress: bool = True, desc: str = "train",
                  parent_model: str | Path | None = None) -> TrainResult:
    """Build the task and model of a run spec and train it; saves the final model in run_dir.

    ``spec`` is a ``RunSpec`` or its dict form (``RunSpec.from_dict``). A spec with
    ``from_run`` starts from the parent run's final model at ``parent_model``
    (``build.start_from``).

    Raises:
        ValueError: a malformed spec (unknown key, bad option), naming the field.
    """
    t0 = time.perf_counter()
    spec = RunSpec.from_dict(spec)
    cfg = spec.train
    task = make_task(spec.task, spec.task_options)
    if spec.from_run is not None:  # another run's trained model, tied where the spec says
        model = start_from(spec, task, parent_model)
    else:
        kind = spec.kind or getattr(task, "model_kind", "decoder")
        model = build_seeded(model_config(spec, task), kind, cfg.seed)
        apply_init(model, spec.init, cfg.seed)
    apply_input_codes(model, task)
    callback = callback_factory(model, task) if callback_factory is not None else None
    setup_s = time.perf_counter() - t0
    result = train(model, task, cfg, run_dir=run_dir, on_log=on_log, callback=callback,
                   dist_info=dist_info, progress=progress, desc=desc)
    result.timings["setup"] += setup_s
    if run_dir is not None and (dist_info is None or dist_info.main) and result.status == "done":
        t0 = time.perf_counter()
        save_model(model, Path(run_dir) / FINAL_MODEL)
        result.timings["checkpoint"] += time.perf_counter() - t0
    return result
