"""Uptraining a converted decoder by distillation from the model it was converted from.

Loss per predicted token (Kayyam et al.'s K=V distillation, and Hinton et al.'s): ``alpha`` ·
T² · KL(p_teacher^(1/T) ‖ p_student^(1/T)) + (1 − alpha) · cross-entropy of the next token, with
T = ``temperature``. The teacher is the untied model, frozen; its final hidden states are
computed once per batch. Neither model's logits over the whole vocabulary (49k for SmolLM2) are
ever held for a whole batch: the loss walks the batch's positions in chunks of ``chunk`` rows,
each chunk's student logits recomputed in the backward pass (``torch.utils.checkpoint``), so a
step holds one chunk of logits at a time (two ``chunk`` × vocabulary matrices) besides the
models.

The rate: AdamW (β 0.9/0.95, no weight decay), linear warmup over ``warmup`` steps, then
constant, and gradients clipped at norm 1. A constant rate makes every budget a prefix of the
same run, so the gap at 16k, 64k and 256k tokens is read off one run, and a longer budget later
resumes from the last checkpoint instead of starting again. Batches are consecutive rows of the
training ids, so step s always reads the same tokens: a killed run resumes from its checkpoint
to the same weights.

Checkpoints (``ckpt_dir``, every 5 minutes and at every scored budget):
``student-<step>.safetensors`` (shared Parameters stored once, by
``safetensors.torch.save_model``), ``optim-<step>.pt`` (the optimizer's tensors, read back with
``torch.load(weights_only=True)``, our own file), then ``state.json`` (step, the two files'
names, records so far), each written atomically; older pairs are removed only after. A kill at
any point leaves ``state.json`` naming a complete pair.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from qkvlab.fileio import atomic_write, atomic_write_text
from qkvlab.train.memory import keep_freed_memory


@dataclass(frozen=True)
class UptrainConfig:
    """Everything the uptraining's result depends on (besides the models and the text)."""
    lr: float = 1e-4
    batch: int = 4
    seq_len: int = 256
    warmup: int = 8
    alpha: float = 0.5
    temperature: float = 2.0
    train: str = "all"          # "all" parameters, or "attention" (the attention modules only)
    chunk: int = 256
    precision: str = "bf16"     # resolved by qkvlab.train.precision (fp32 where bf16 is slow)
    # the output layer's matmuls while training: "fp32" (TF32 on CUDA with a bf16 body), or
    # "bf16" (inputs and weight in bf16, fp32 logits: 6x the fp32 GEMM rate on an AMX Xeon,
    # where the fp32 layer took about a third of a step); scoring is fp32 either way
    head: str = "fp32"
    # a fitted K=V tie's W_O' = W_O·Mᵀ trained as W_O with M fixed ("untied", hf.basis), or as
    # the folded matrix itself ("tied"); only the optimizer's geometry differs
    o_basis: str = "tied"

    def __post_init__(self):
        for name in ("batch", "seq_len", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be a positive integer, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr: must be a finite positive rate, got {self.lr}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha: the KL share must lie in [0, 1], got {self.alpha}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: must be positive, got {self.temperature}")
        if self.train not in ("all", "attention"):
            raise ValueError(f"train: {self.train!r} is not 'all' or 'attention'")
        if self.head not in ("fp32", "bf16"):
            raise ValueError(f"head: {self.head!r} is not 'fp32' or 'bf16'")
        if self.o_basis not in ("tied", "untied"):
            raise ValueError(f"o_basis: {self.o_basis!r} is not 'tied' or 'untied'")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    def to_dict(self) -> dict:
        """Every field; ``head`` and ``o_basis`` only when not at their defaults, so records
        made before them keep their ids."""
        d = asdict(self)
        for name, default in (("head", "fp32"), ("o_basis", "tied")):
            if d[name] == default:
                del d[name]
        return d


def _head(model: nn.Module) -> tuple[nn.Module, nn.Module, float | None]:
    """(body returning last_hidden_state, output embedding, final logit soft-cap or None)."""
    body = getattr(model, "model", None)
    head = model.get_output_embeddings()
    if body is None or head is None:
        raise ValueError(f"model: {type(model).__name__} has no .model body and output embedding")
    cap = getattr(model.config, "final_logit_softcapping", None)
    return body, head, cap


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32, or wider if it is (a float64 model stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _logits(h: torch.Tensor, head: nn.Module, cap: float | None) -> torch.Tensor:
    z = _wide(head(h))
    return z if cap is None else torch.tanh(z / cap) * cap


def _chunk_loss(hs, ht, y, s_weight, s_bias, t_weight, t_bias, cap, alpha, temp):
    """Summed loss of one chunk of rows: alpha·T²·KL + (1−alpha)·CE (student weight passed in so
    the checkpoint re-runs with the live Parameter, or its bf16 cast: then the chunk's rows are
    cast too, and the logits come out in fp32)."""
    zs = _wide(nn.functional.linear(hs.to(s_weight.dtype), s_weight, s_bias))
    zs = zs if cap is None else torch.tanh(zs / cap) * cap
    out = zs.new_zeros(())
    if alpha < 1:
        out = out + (1 - alpha) * nn.functional.cross_entropy(zs, y, reduction="sum")
    if alpha > 0:
        with torch.no_grad():
            zt = _wide(nn.functional.linear(ht.to(t_weight.dtype), t_weight, t_bias))
            zt = zt if cap is None else torch.tanh(zt / cap) * cap
            log_pt = nn.functional.log_softmax(zt / temp, -1)
        log_ps = nn.functional.log_softmax(zs / temp, -1)
        kl = nn.functional.kl_div(log_ps, log_pt, log_target=True, reduction="sum")
        out = out + alpha * temp * temp * kl
    return out


def distill_loss(student: nn.Module, teacher: nn.Module, x: torch.Tensor, cfg: UptrainConfig,
                 autocast) -> torch.Tensor:
    """Mean loss per predicted token of ``x`` [B, T] (see the module doc), ready for backward."""
    s_body, s_head, cap = _head(student)
    t_body, t_head, _ = _head(teacher)
    with autocast():
        if cfg.alpha > 0:
            with torch.no_grad():
                ht = t_body(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
        hs = s_body(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
    # the output layer and the loss in fp32: bf16 logits would be off by ~0.1 at |z| ~ 20
    d = hs.shape[-1]
    hs, y = _wide(hs.reshape(-1, d)), x[:, 1:].reshape(-1)
    ht = _wide(ht.reshape(-1, d)) if cfg.alpha > 0 else hs.detach()
    total = hs.new_zeros(())
    s_weight, s_bias = s_head.weight, getattr(s_head, "bias", None)
    t_weight, t_bias = t_head.weight.detach(), getattr(t_head, "bias", None)
    if cfg.head == "bf16":  # cast once per step; the gradient reaches the fp32 weight through it
        s_weight, t_weight = s_weight.to(torch.bfloat16), t_weight.to(torch.bfloat16)
        s_bias = None if s_bias is None else s_bias.to(torch.bfloat16)
        t_bias = None if t_bias is None else t_bias.detach().to(torch.bfloat16)
    for s in range(0, len(y), cfg.chunk):
        total = total + checkpoint(
            _chunk_loss, hs[s:s + cfg.chunk], ht[s:s + cfg.chunk], y[s:s + cfg.chunk],
            s_weight, s_bias, t_weight, t_bias, cap, cfg.alpha, cfg.temperature,
            use_reentrant=False)
    return total / len(y)


@torch.no_grad()
def sequence_nll(model: nn.Module, ids: torch.Tensor, batch: int = 4) -> list[float]:
    """Summed next-token nll (nats) of each row of ``ids`` [N, T]: fp32 throughout (every model
    is scored the same way, whatever precision it trained in), one row's logits at a time."""
    body, head, cap = _head(model)
    was = model.training
    model.eval()
    out = []
    for s in range(0, len(ids), batch):
        x = ids[s:s + batch]
        h = body(input_ids=x, use_cache=False).last_hidden_state[:, :-1]
        for row, y in zip(h, x[:, 1:]):
            z = _logits(_wide(row), head, cap)
            out.append(nn.functional.cross_entropy(z, y, reduction="sum").item())
    model.train(was)
    return out


@contextlib.contextmanager
def _matmul_precision(level: str | None):
    """``torch.set_float32_matmul_precision(level)`` inside, the caller's setting after."""
    if level is None:
        yield
        return
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def trainable(model: nn.Module, which: str) -> list[nn.Parameter]:
    """Distinct Parameters to train: all of them, or those of the attention modules."""
    if which == "all":
        params = model.parameters()
    else:
        from qkvlab.hf.tie import decoder_layers
        params = (p for layer in decoder_layers(model) for p in layer.self_attn.parameters())
    return list({id(p): p for p in params}.values())


class Uptrainer:
    """Holds student, teacher, optimizer and the step; ``run_to(step)`` trains on, checkpointing.

    On the CPU it sets the process's allocator to keep freed memory
    (:func:`qkvlab.train.memory.keep_freed_memory`): a step's large logit chunks otherwise
    cost a third of it in page faults; results are unchanged."""

    def __init__(self, student: nn.Module, teacher: nn.Module, train_ids: torch.Tensor,
                 cfg: UptrainConfig, ckpt_dir: Path, autocast):
        self.student, self.teacher, self.ids, self.cfg = student, teacher, train_ids, cfg
        self.dir, self.autocast = Path(ckpt_dir), autocast
        if next(student.parameters()).device.type == "cpu":
            keep_freed_memory()
        for p in teacher.parameters():
            p.requires_grad_(False)
        params = trainable(student, cfg.train)
        for p in student.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        self.params = params
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / (cfg.warmup + 1)))
        self.step, self.state = 0, {"records": [], "losses": []}

    # ---- checkpoints -------------------------------------------------------------------------
    def resume(self) -> bool:
        """Load the last checkpoint in ``ckpt_dir`` if one is there; True if one was."""
        state = self.dir / "state.json"
        if not state.exists():
            return False
        import safetensors.torch
        saved = json.loads(state.read_text())
        if saved.get("config") != self.cfg.to_dict():
            raise ValueError(f"{self.dir}: checkpoint made with another configuration "
                             f"({saved.get('config')}); delete the folder or use another store")
        # a checkpoint of the first layout (one fixed pair of names) reads as well
        student = saved.get("student", "student.safetensors")
        optim = saved.get("optim", "optim.pt")
        safetensors.torch.load_model(self.student, self.dir / student, strict=True)
        self.opt.load_state_dict(torch.load(self.dir / optim, weights_only=True))
        self.sched.load_state_dict(saved["sched"])
        self.step, self.state = saved["step"], {k: saved[k] for k in ("records", "losses")}
        return True

    def save(self) -> None:
        import safetensors.torch
        self.dir.mkdir(parents=True, exist_ok=True)
        files = {"student": f"student-{self.step}.safetensors", "optim": f"optim-{self.step}.pt"}
        atomic_write(self.dir / files["student"],
                     lambda p: safetensors.torch.save_model(self.student, str(p)))
        atomic_write(self.dir / files["optim"], lambda p: torch.save(self.opt.state_dict(), p))
        atomic_write_text(self.dir / "state.json", json.dumps(
            {"step": self.step, "config": self.cfg.to_dict(), **files,
             "sched": self.sched.state_dict(), **self.state}))
        for old in [*self.dir.glob("student*.safetensors"), *self.dir.glob("optim*.pt")]:
            if old.name not in files.values():  # state.json names the pair in use
                old.unlink(missing_ok=True)

    # ---- training ----------------------------------------------------------------------------
    def steps_available(self) -> int:
        return len(self.ids) // self.cfg.batch

    @property
    def head_precision(self) -> str:
        """The output layer's matmuls while training: TF32 on CUDA when the body runs in bf16
        (plain fp32 without tensor cores would take about half of a step there), else fp32.
        Scoring is fp32 everywhere."""
        if self.cfg.head == "bf16":
            return "bf16"
        cuda = next(self.student.parameters()).is_cuda
        return "tf32" if cuda and self.cfg.precision == "bf16" else "fp32"

    def run_to(self, step: int, bar=None, every_s: float = 300.0,
               deadline: float | None = None) -> bool:
        """Train until ``self.step == step``, checkpointing every ``every_s`` seconds (a step
        takes seconds on a CPU, milliseconds on a GPU, where a per-step rule would spend the run
        writing) and at the end. Past ``deadline`` (``time.monotonic()``) it checkpoints and
        returns False before reaching ``step``; True when it got there."""
        import time
        last = time.monotonic()
        if step > self.steps_available():
            raise ValueError(f"text: {len(self.ids)} training sequences hold "
                             f"{self.steps_available()} steps of {self.cfg.batch}, need {step}")
        self.student.train()
        while self.step < step:
            if deadline is not None and time.monotonic() >= deadline:
                self.save()
                self.student.eval()
                return False
            b = self.cfg.batch
            x = self.ids[self.step * b:(self.step + 1) * b]
            with _matmul_precision("high" if self.head_precision == "tf32" else None):
                loss = distill_loss(self.student, self.teacher, x, self.cfg, self.autocast)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"uptraining diverged at step {self.step}: "
                                             f"loss {loss}")
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.sched.step()
            self.step += 1
            self.state["losses"].append(round(loss.item(), 5))
            if bar is not None:
                bar.update(self.cfg.tokens_per_step)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if self.step == step or time.monotonic() - last >= every_s:
                self.save()
                last = time.monotonic()
        self.student.eval()
        return True
