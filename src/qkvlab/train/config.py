"""What one training run is: ``TrainConfig`` (optimization) inside ``RunSpec`` (everything).

A ``RunSpec`` determines a run's result: the task and its options, the model options, the
training options, and the optional scale probe and re-initialization. The results store hashes
its canonical dict (``spec.to_dict()``) into the run id, so equal specs share one run.
Round trip through plain dicts (JSON in the store, spec files for ``torchrun``)::

    spec = RunSpec.from_dict({"task": "lm", "model": {"design": "tied_kv"},
                              "train": {"steps": 50}})
    spec.to_dict()   # every field, defaults included: the canonical form
    RunSpec.from_dict({"task": "lm", "trian": {}})  # ValueError: trian: unknown key; allowed: [...]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkvlab import typed
from qkvlab.data.base import MODEL_KINDS
from qkvlab.inputs import InputFileError
from qkvlab.models import ModelConfig
from qkvlab.models.config import check_numbers

# "bf16" falls back to fp32 (with a warning) where bf16 is slow, "bf16_force" does not:
# see qkvlab.train.precision
PRECISIONS = ("fp32", "bf16", "bf16_force")
INITS = ("gpt2", "unit", "t5", "unit_t5")


@dataclass(frozen=True)
class TrainConfig:
    """Optimization and bookkeeping of one run.

    ``eval_every=0`` evaluates only at the end; ``checkpoint_every=0`` never checkpoints;
    ``keep_at`` lists steps whose model weights are kept as ``model_step{N}.safetensors``
    (for analyses of how weights evolve). ``test_batches`` batches (of ``eval_batch_size``) of
    the held-out ``test`` split score the final model once, at the end of a run that finished,
    into ``TrainResult.final`` as ``test_<metric>`` (0: not scored): the numbers a study reports,
    on data that no choice made on ``val`` saw. ``lr`` is the peak after ``warmup`` linear steps;
    it then follows a cosine down to ``min_lr_ratio * lr`` at ``steps``. ``precision`` is
    ``fp32``, ``bf16`` (autocast where the hardware has native bf16, else fp32 with a warning)
    or ``bf16_force`` (bf16 autocast even where it is slow); the precision a run actually used
    is ``TrainResult.precision_used``.

    Raises:
        ValueError: a field out of range or of the wrong type, named as ``train.<field>``.
    """

    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 0
    eval_batches: int = 4
    eval_batch_size: int = 32
    test_batches: int = 0
    log_every: int = 10
    checkpoint_every: int = 0
    keep_at: tuple[int, ...] = ()
    precision: str = "fp32"
    compile: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_batches", "eval_batch_size", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"train.{name}: {v!r} must be a positive integer")
        for name in ("warmup", "eval_every", "checkpoint_every", "test_batches", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"train.{name}: {v!r} must be a non-negative integer")
        for name in ("lr", "weight_decay", "grad_clip"):
            typed.check_number(getattr(self, name), f"train.{name}")
        typed.check_number(self.min_lr_ratio, "train.min_lr_ratio", 0.0, 1.0)
        for name in ("beta1", "beta2"):  # AdamW's own range
            typed.check_number(getattr(self, name), f"train.{name}", 0.0, 1.0, hi_open=True)
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision: {self.precision!r} "
                             f"is not one of {list(PRECISIONS)}")
        object.__setattr__(self, "keep_at", typed.check_step_list(self.keep_at, "train.keep_at"))

    def to_dict(self) -> dict[str, Any]:
        return typed.to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        return typed.from_dict(cls, d, "train")


@dataclass(frozen=True)
class ProbeConfig:
    """The scale probe (``qkvlab.experiments.probe``): statistics at ``steps``; a row counts as
    saturated when its largest attention weight exceeds ``sat``."""

    steps: tuple[int, ...] = (0,)
    sat: float = 0.99

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", typed.check_step_list(self.steps, "probe.steps"))
        typed.check_number(self.sat, "probe.sat", 0.0, 1.0, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class InitConfig:
    """Re-initialization of the attention input projections (``apply_init``): ``qk="unit"``
    draws them from N(0, 1/d_model), the regime of the 1/√d_k argument; ``gpt2`` keeps the
    model's own init (std 0.02); ``t5`` keeps it and multiplies the query block by
    d_head^-1/2 (T5 folds 1/√d_k into W_Q's init instead of scaling the scores); ``unit_t5``
    draws them as ``unit`` and then scales the query block as ``t5`` (T5's own init: W_Q from
    N(0, 1/(d_model·d_head)), W_K and W_V from N(0, 1/d_model))."""

    qk: str = "gpt2"

    def __post_init__(self) -> None:
        if self.qk not in INITS:
            raise ValueError(f"init.qk: {self.qk!r} is not one of {list(INITS)}")


MODEL_KEYS = frozenset(typed.field_names(ModelConfig))
TIES = ("none", "kv")  # what a run started from another run's model imposes on it first
TIE_STARTS = ("fitted", "keep_k", "keep_v", "avg")  # qkvlab.models.tie.STARTS


@dataclass(frozen=True)
class FromRun:
    """A run that starts from another run's trained model (the controlled conversion): the
    parent's final weights (``spec``, the parent's ``RunSpec`` dict, so the child's id hashes
    its parent's whole spec), tied K = V from ``start`` (``qkvlab.models.tie``) where ``tie`` is
    ``"kv"``, or kept as they are (``"none"``: the untied model trained on the same way). The
    fitted start's input moments come from ``calib_batches`` training batches of the parent's
    task (drawn with the child's seed); the child then trains as its ``train`` says, from
    step 0 of a fresh optimizer and schedule.
    """

    spec: Mapping[str, Any]
    tie: str = "kv"
    start: str | None = None
    calib_batches: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.spec, Mapping):
            raise ValueError(f"from_run.spec: {self.spec!r} must be the parent run's spec")
        if self.tie not in TIES:
            raise ValueError(f"from_run.tie: {self.tie!r} is not one of {list(TIES)}")
        if self.tie == "none" and self.start is not None:
            raise ValueError(f"from_run.start: {self.start!r} needs a tie; with tie 'none' "
                             "the model is kept as it is (start None)")
        if self.tie != "none" and self.start not in TIE_STARTS:
            raise ValueError(f"from_run.start: {self.start!r} is not one of {list(TIE_STARTS)} "
                             f"(tie {self.tie!r} needs one)")
        v = self.calib_batches
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"from_run.calib_batches: {v!r} must be a positive integer")
        parent = RunSpec.from_dict(self.spec)  # checked whole; stored canonical
        if parent.from_run is not None:
            raise ValueError("from_run.spec: the parent starts from another run itself; "
                             "a chain of conversions is not supported")
        object.__setattr__(self, "spec", parent.to_dict())

    @property
    def parent(self) -> RunSpec:
        return RunSpec.from_dict(self.spec)


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines one training run's result.

    ``model`` holds ``ModelConfig`` options; ``d_vocab`` and ``n_ctx`` come from the task when
    absent. ``task_version`` is the task's data version (bumped when its data changes), so runs
    on old data are not reused. ``kind`` (decoder, encoder, encdec) defaults to the task's.
    ``from_run``: the run starts from another run's trained model (``FromRun``) instead of
    its seed's initial weights; ``model`` must then be the model that start gives. It is left
    out of the canonical dict when None, so the runs stored before it existed keep their ids.
    """

    task: str
    task_version: int = 0
    task_options: Mapping[str, Any] = field(default_factory=dict)
    kind: str | None = None
    model: Mapping[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    probe: ProbeConfig | None = None
    init: InitConfig | None = None
    from_run: FromRun | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task: {self.task!r} must be a task name such as 'lm'")
        if self.kind is not None and self.kind not in MODEL_KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {list(MODEL_KINDS)}")
        for name in ("task_options", "model"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a mapping")
        typed.check_keys(self.model, MODEL_KEYS, "model")
        check_numbers(self.model, "model")  # NaN dropout: refused here, not deep in a run
        object.__setattr__(self, "task_options", dict(self.task_options))
        object.__setattr__(self, "model", dict(self.model))

    def to_dict(self) -> dict[str, Any]:
        """The canonical dict: every field, defaults included (what the run id hashes), but
        ``from_run`` only where it is set."""
        d = typed.to_dict(self)
        if self.from_run is None:
            del d["from_run"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | RunSpec) -> RunSpec:
        """Raises ValueError naming an unknown key or a bad value as ``section.key``."""
        return typed.from_dict(cls, d)

    def replace(self, **changes) -> RunSpec:
        return typed.replace(self, **changes)


MAX_SPEC_BYTES = 16 << 20  # a spec is a few hundred bytes; a larger file is not one


def load_spec(path: str | os.PathLike) -> RunSpec:
    """The ``RunSpec`` in a JSON file (what ``python -m qkvlab.train`` and torchrun read),
    checked whole before anything runs: its keys and values, a registered task's options (the
    task is built, not prepared) and the model options (with the task's vocabulary and context
    still unknown, a stand-in of 2 for each).

    Raises:
        InputFileError: no such file, not JSON, or a spec that does not validate; the message
            names the file and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: {'not a file' if path.exists() else 'no such file'}",
                             path=path)
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise InputFileError(f"{path}: {path.stat().st_size:,} bytes is too large for a run "
                             "spec", path=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputFileError(f"{path}: not a JSON run spec ({e})", path=path) from None
    from qkvlab.data import get_task  # registers the tasks; data imports nothing from train

    try:
        spec = RunSpec.from_dict(data)
        if ":" not in spec.task:  # a module:Class task is the user's own code, built when run
            get_task(spec.task, **spec.task_options)
        else:  # and only from a module the user opted in to; nothing is imported here
            from qkvlab.train.build import check_task_name
            check_task_name(spec.task)
        ModelConfig.from_dict({"d_vocab": 2, "n_ctx": 2, **spec.model})
    except (ValueError, TypeError, RecursionError) as e:
        raise InputFileError(f"{path}: {e}", path=path) from None
    return spec
