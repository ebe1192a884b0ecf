"""The ``Task`` interface the trainer codes against, the task registry, and shared helpers.

A task is a frozen dataclass (its fields are its options, hashed into a run id) with class
attributes ``name``, ``version`` (bump when batches or metrics change meaning) and
``model_kind`` (``decoder`` | ``encoder`` | ``encdec``, the ``qkvlab.models.KINDS`` key).

Batches are dicts of CPU tensors. Shapes: B batch, T ``seq_len`` (or the longest sequence in a
translation batch), V ``d_vocab``. Targets use ``IGNORE = -100`` where no loss is taken, the
``ignore_index`` of ``torch.nn.functional.cross_entropy``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkvlab import typed

IGNORE = -100
SPLITS = ("train", "val", "test")
MODEL_KINDS = ("decoder", "encoder", "encdec")


@dataclass(frozen=True)
class Task:
    """One training objective with its data and its metrics.

    Subclasses implement ``d_vocab``, ``batch``, and, where the default does not fit, ``loss``
    and ``evaluate``. The same ``generator`` state gives the same batches.
    """

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    model_kind: ClassVar[str] = "decoder"

    seq_len: int = 64

    def __post_init__(self) -> None:
        check_int(self, "seq_len", 2)

    # -- data ---------------------------------------------------------------------------
    def prepare(self, cache_dir: Path | None = None) -> None:
        """Build (once) and load what the task needs; synthetic tasks need nothing."""

    @property
    def d_vocab(self) -> int:
        """Vocabulary size the model needs; tasks on real data prepare themselves (default
        cache) if ``prepare`` was not called first."""
        raise NotImplementedError

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``{"idx": (B, T) long, "targets": (B, T) long}`` for decoder tasks."""
        raise NotImplementedError

    # -- objective and metrics ------------------------------------------------------------
    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """Scalar mean cross-entropy over the positions whose target is not ``IGNORE``."""
        batch = to_device(batch, model)
        logits = model(batch["idx"])  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten())

    @torch.no_grad()
    def evaluate(self, model: nn.Module, generator: torch.Generator, n_batches: int,
                 batch_size: int, *, split: str = "val") -> dict[str, float]:
        """``val_loss`` and ``accuracy`` (argmax at target positions) over ``n_batches``.

        Pass a generator seeded the same way at every evaluation, so that runs and steps are
        compared on the same validation batches. The model's train/eval mode is restored.
        """
        check_eval_args(n_batches, batch_size)
        with eval_mode(model):
            loss_sum, n_tok, n_right = 0.0, 0, 0
            for _ in range(n_batches):
                b = to_device(self.batch(split, batch_size, generator), model)
                logits = model(b["idx"]).float()  # (B, T, V)
                keep = b["targets"] != IGNORE  # (B, T)
                loss_sum += F.cross_entropy(logits[keep], b["targets"][keep],
                                            reduction="sum").item()
                n_right += (logits[keep].argmax(-1) == b["targets"][keep]).sum().item()
                n_tok += int(keep.sum())
        return {"val_loss": loss_sum / n_tok, "accuracy": n_right / n_tok}

    # -- identity -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Name, version and every option: what a run id should hash."""
        return {"task": self.name, "version": self.version, **dataclasses.asdict(self)}

    # Loaded arrays live in private attributes (not fields); a worker process reloads them from
    # the same cache instead of receiving a pickled copy.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if not k.startswith("_") or k == "_cache_dir"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)


TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: add a task to ``TASKS`` under ``cls.name``."""
    if not cls.name or cls.name in TASKS:
        raise ValueError(f"task name {cls.name!r} is empty or registered twice")
    if cls.model_kind not in MODEL_KINDS:
        raise ValueError(f"{cls.name}.model_kind: {cls.model_kind!r} is not one of "
                         f"{list(MODEL_KINDS)}")
    TASKS[cls.name] = cls
    return cls


def get_task(name: str, **options: Any) -> Task:
    """Instantiate a registered task; ``ValueError`` names an unknown task or option."""
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; allowed: {sorted(TASKS)}")
    cls = TASKS[name]
    typed.check_keys(options, typed.field_names(cls), name)
    return cls(**options)


# -- helpers shared by the tasks -------------------------------------------------------------
def check_int(task: Task, field: str, lo: int, hi: int | None = None) -> None:
    v = getattr(task, field)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{task.name}.{field}: {v!r} must be an integer {rng}")


def check_choice(task: Task, field: str, allowed) -> None:
    v = getattr(task, field)
    if v not in allowed:
        raise ValueError(f"{task.name}.{field}: {v!r} is not one of {list(allowed)}")


def check_split(task: Task, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"{task.name}: split {split!r} is not one of {list(SPLITS)}")


def check_eval_args(n_batches: int, batch_size: int) -> None:
    for field, v in (("n_batches", n_batches), ("batch_size", batch_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{field}: {v!r} must be a positive integer")


def to_device(batch: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Move a batch to the device of ``model``'s first parameter (a no-op when already there)."""
    p = next(model.parameters(), None)
    if p is None or all(t.device == p.device for t in batch.values()):
        return batch
    return {k: t.to(p.device, non_blocking=True) for k, t in batch.items()}


class eval_mode:
    """``model.eval()`` inside the block, the previous mode restored after."""

    def __init__(self, model: nn.Module):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()
        return self.model

    def __exit__(self, *exc):
        self.model.train(self.was_training)


def bits(nats: float) -> float:
    return nats / math.log(2)
