"""What a run starts from: its task (a registered name or a ``module:Class``), its model built
from a seed, the optional re-initialization of the attention input projections and the fixed
input codes a task may impose. The trainer (``trainer.run_from_spec``) calls these before its
first step; the study and the tests build runs with them too.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkvlab.data import get_task
from qkvlab.data.base import TASKS, Task
from qkvlab.models import ModelConfig, build_model, load_model
from qkvlab.train.config import InitConfig, RunSpec


# Modules whose Task classes a spec may name as ``module:Class``: empty unless the user opts in
# (``allow_task_modules``, ``--task-module``), because a spec is data, often read from a store or
# a file someone else wrote, and importing the module it names runs that module's code.
TASK_MODULES: set[str] = set()
STUDY_GROUP = "qkvlab.studies"  # installed studies (entry points) may register tasks of their own
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def allow_task_modules(*modules: str) -> None:
    """Opt in to ``module:Class`` tasks from ``modules`` in this process (a sweep passes the
    set on to its workers). Names are checked here, imported only when a run needs one.

    Raises:
        ValueError: a name that is not a dotted Python module name.
    """
    for mod in modules:
        if not isinstance(mod, str) or not _MODULE.fullmatch(mod):
            raise ValueError(f"task module: {mod!r} is not a Python module name")
    TASK_MODULES.update(modules)


def check_task_name(name: str, task_modules=()) -> None:
    """Refuse, without importing anything, a ``module:Class`` task whose module nobody opted in
    to (``allow_task_modules`` or ``task_modules``); a registered name passes here."""
    if ":" not in name:
        return
    mod = name.partition(":")[0]
    if mod not in TASK_MODULES and mod not in task_modules:
        raise ValueError(f"task: {name!r} names code to import, which qkvlab runs only from a "
                         f"module you name: --task-module {mod} (Python: qkvlab.train."
                         f"allow_task_modules({mod!r})); registered tasks: {sorted(TASKS)}")


def _load_studies() -> None:
    """Import the installed studies (entry points), which may register tasks of their own."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=STUDY_GROUP):
        importlib.import_module(ep.value)


def make_task(name: str, options: Mapping[str, Any] | None = None, task_modules=()):
    """A prepared task: a registered name (``qkvlab.data.get_task``, or a task an installed
    study registers) or ``module:Class``.

    ``module:Class`` lets a user (or a test) bring a task of their own without registering it,
    only from a module they opted in to (``allow_task_modules``, or ``task_modules`` here): a
    spec naming any other module is refused before anything is imported. The class must
    subclass ``qkvlab.data.base.Task``, checked before it is called.
    """
    options = dict(options or {})
    check_task_name(name, task_modules)
    if ":" in name:
        mod, _, cls = name.partition(":")
        try:
            found = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"task: cannot import {name!r} ({e})") from None
        if not (isinstance(found, type) and issubclass(found, Task)):
            raise ValueError(f"task: {name!r} is not a task class (a module:Class task must "
                             "subclass qkvlab.data.base.Task)")
        task = found(**options)
    else:
        if name not in TASKS:
            _load_studies()
        task = get_task(name, **options)
    task.prepare()
    return task


def build_seeded(model_cfg, kind: str, seed: int) -> nn.Module:
    """The model of ``model_cfg`` initialized from ``seed`` (same seed, same weights; an
    encoder and a decoder of one config get identical initial weights)."""

    torch.manual_seed(seed)
    return build_model(model_cfg, kind)


def apply_init(model: nn.Module, init: InitConfig | None, seed: int = 0) -> None:
    """Optional re-initialization of the attention input projections (``InitConfig``).

    ``qk="unit"`` draws ``W_in`` from N(0, 1/d_model): on LayerNorm'd inputs every
    query/key entry then has unit variance and a raw score q·k has variance d_k, the regime
    in which the 1/√d_k argument is made (Vaswani et al. 2017, footnote 4). The default
    (``gpt2``, std 0.02) keeps scores near 0 at init whatever d_k.

    ``qk="t5"`` keeps the model's init and multiplies each query block (W_Q, b_Q) by
    d_head^-1/2: T5 (Raffel et al. 2020) folds 1/√d_k into W_Q's init, so with
    ``scale="none"`` a model starts from the scores the same seed gives with it inside.
    ``qk="unit_t5"``: ``unit``'s draw, then ``t5``'s scaling (T5's own init).

    Raises:
        ValueError: ``t5`` or ``unit_t5`` on a design without a query block of its own (tied
            Q=K: it would scale K too; uniform: no queries).
    """
    if init is None or init.qk == "gpt2":
        return
    t5 = init.qk in ("t5", "unit_t5")
    for name, _, att in model.attention_layers() if t5 else ():  # refused before any change
        if att.segment_of("q") != "q":
            raise ValueError(f"init.qk: {init.qk!r} scales W_Q's init by 1/sqrt(d_head), so it "
                             f"needs a design with a query block of its own; {name} is "
                             f"{att.cfg.design!r} (query segment {att.segment_of('q')!r})")
    if init.qk in ("unit", "unit_t5"):
        gen = torch.Generator().manual_seed(seed + 1)  # a function of the run seed only
        for _, _, att in model.attention_layers():
            with torch.no_grad():
                att.W_in.normal_(0.0, att.cfg.d_model ** -0.5, generator=gen)
    if t5:
        for _, _, att in model.attention_layers():
            rows, inner = att._slices["q"], 1.0 / math.sqrt(att.cfg.d_head)  # inner_scale's
            with torch.no_grad():
                att.W_in[rows] *= inner
                if att.b_in is not None:
                    att.b_in[rows] *= inner


def apply_input_codes(model: nn.Module, task) -> None:
    """Freeze the token embedding to the task's fixed input codes, if it has them
    (``input_codes()``: (d_vocab, d_code), written into the first d_code dimensions, the rest
    zero), so that what a token carries is set by the task, not learned (``bind_codes``).

    Raises:
        ValueError: the model ties its readout to the embedding (which must then learn), or
            the codes are wider than ``d_model``.
    """
    codes = getattr(task, "input_codes", None)
    if codes is None:
        return
    codes, cfg = codes(), model.cfg
    if cfg.tie_embeddings:
        raise ValueError(f"model.tie_embeddings: task {task.name} fixes each token's input code "
                         "and freezes the token embedding, so the readout must not share it; "
                         "set tie_embeddings=False")
    if codes.shape != (cfg.d_vocab, codes.shape[1]) or codes.shape[1] > cfg.d_model:
        raise ValueError(f"model.d_model: task {task.name}'s input codes are "
                         f"{tuple(codes.shape)}; they need d_vocab={cfg.d_vocab} rows and at "
                         f"most d_model={cfg.d_model} columns")
    wte = model.embed.wte.weight
    with torch.no_grad():
        wte.zero_()
        wte[:, :codes.shape[1]] = codes.to(wte.dtype)
    wte.requires_grad_(False)


def model_config(spec: RunSpec, task) -> ModelConfig:
    """The ``ModelConfig`` of a run spec: its ``model`` options plus the task's vocab/context."""
    opts = dict(spec.model)
    opts.setdefault("d_vocab", task.d_vocab)
    opts.setdefault("n_ctx", getattr(task, "n_ctx", None) or task.seq_len)
    return ModelConfig.from_dict(opts)


def start_from(spec: RunSpec, task, parent_model: str | os.PathLike | None) -> nn.Module:
    """The model a ``from_run`` spec starts from: the parent run's trained weights (the final
    model its run folder keeps, ``parent_model``), tied K = V from the spec's start where it
    says so (``qkvlab.models.tie``; the fitted start calibrated on ``calib_batches`` training
    batches of ``task`` drawn with the run's seed).

    Raises:
        ValueError: no parent model file (the parent has not finished), a parent of another
            task, or a spec whose ``model`` is not the model the start gives.
        InputFileError: a damaged parent model file (``load_model``).
    """
    from qkvlab.models.tie import tie_kv  # models.tie imports attention only; kept local

    fr = spec.from_run
    parent = fr.parent
    if (parent.task, parent.task_options) != (spec.task, spec.task_options):
        raise ValueError(f"from_run.spec: the parent trained on task {parent.task!r} "
                         f"{parent.task_options}; this run trains on {spec.task!r} "
                         f"{spec.task_options}: a conversion keeps the task")
    if parent_model is None or not Path(parent_model).is_file():
        raise ValueError(f"from_run: the parent run's trained model ({parent_model}) is not "
                         "there: train the parent run first (a sweep lists a conversion only "
                         "once its parents are done)")
    model = load_model(parent_model)
    if fr.tie == "kv":
        gen = torch.Generator().manual_seed(spec.train.seed)
        batches = [task.batch("train", spec.train.batch_size, gen)["idx"]
                   for _ in range(fr.calib_batches)]
        model = tie_kv(model, batches, fr.start)
    want = model_config(spec, task)
    if model.cfg != want:
        diff = sorted(k for k, v in want.to_dict().items() if model.cfg.to_dict()[k] != v)
        raise ValueError(f"model: the start from the parent run gives another model than this "
                         f"run's spec describes (differs in {diff})")
    return model
