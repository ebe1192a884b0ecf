"""Training checkpoints: model + AdamW state + RNG states in one safetensors file.

Layout of one checkpoint file (never pickle; ``torch.load`` is not used at all):
    ``model.<param name>``             every parameter and buffer (a tied tensor once)
    ``optim.<param name>.<state key>`` AdamW moments and step counters, keyed by parameter
                                       name rather than by position, so a reordering fails loudly
    ``rng.<name>``                     uint8 RNG states (torch CPU, the data generator)
and string metadata: ``qkvlab_checkpoint`` (JSON: step, optimizer hyper-parameters, trainer
state such as the metrics history) and ``qkvlab_digest`` (sha256 of every tensor's bytes), so a
truncated or bit-flipped file is a clear ``ValueError`` instead of a silently wrong resume.

Files are written to a temp file in the same folder and renamed: a kill at any moment leaves
either the previous checkpoint or the new one, never half of one. A kill before the rename
leaves the temp file (``.checkpoint.safetensors.<hex>.tmp``, often empty): it is never read as
a checkpoint, and the next save or resume in that folder removes it
(:func:`discard_temp_files`); a save that fails removes its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

from qkvlab.fileio import atomic_write, temp_files
from qkvlab.inputs import InputFileError

FORMAT = 1


def _param_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (tied parameters appear once)."""
    return {id(p): n for n, p in model.named_parameters()}


def _digest(tensors: dict[str, Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_checkpoint(path: str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, *, step: int,
                    rng: dict[str, Tensor] | None = None,
                    state: dict[str, Any] | None = None) -> Path:
    """Write a resumable checkpoint atomically; returns its path.

    Args:
        model: the (unwrapped) model; parameters and buffers are saved by name.
        optimizer: an optimizer whose per-parameter state holds tensors (AdamW), or None.
        step: number of optimizer steps taken.
        rng: named uint8 RNG state tensors (``torch.get_rng_state()``, generator states).
        state: JSON-serializable trainer state (metrics history, counters).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    for n, p in model.named_parameters():
        tensors[f"model.{n}"] = p.detach().to("cpu").contiguous().clone()
    for n, b in model.named_buffers():
        tensors[f"model.{n}"] = b.detach().to("cpu").contiguous().clone()
    groups: list[dict[str, Any]] = []
    if optimizer is not None:
        names = _param_names(model)
        for g in optimizer.param_groups:
            hyper = {k: v for k, v in g.items() if k != "params"}
            hyper["params"] = [names[id(p)] for p in g["params"]]
            groups.append(hyper)
            for p in g["params"]:
                for key, val in optimizer.state.get(p, {}).items():
                    # AdamW keeps only tensors; anything else is a bug
                    if not isinstance(val, Tensor):
                        raise ValueError(f"optimizer: state {key!r} is not a tensor; "
                                         "cannot save it without pickle")
                    tensors[f"optim.{names[id(p)]}.{key}"] = (val.detach().to("cpu")
                                                              .contiguous().clone())
    for n, t in (rng or {}).items():
        tensors[f"rng.{n}"] = t.detach().to("cpu").contiguous().clone()
    meta = {"format": FORMAT, "step": int(step), "param_groups": groups, "state": state or {}}
    header = {"qkvlab_checkpoint": json.dumps(meta, sort_keys=True),
              "qkvlab_digest": _digest(tensors)}
    discard_temp_files(path.parent, path.name)
    atomic_write(path, lambda tmp: safetensors.torch.save_file(tensors, tmp, metadata=header))
    return path


def discard_temp_files(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove the temp files that killed saves left in ``folder`` (of the file ``name``, or of
    any file); returns them. Only the folder's one writer calls this: a run's folder belongs
    to the worker that claimed the run."""
    found = temp_files(folder, name)
    for tmp in found:
        tmp.unlink(missing_ok=True)
    return found


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tensors and metadata of a checkpoint, verified against its digest.

    Raises:
        InputFileError: missing, truncated, corrupt, or not a qkvlab checkpoint, naming the
            file (a ``ValueError``).
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"checkpoint: {path} does not exist", path=path)
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own types for bad headers / short files
        raise InputFileError(f"checkpoint: {path} is truncated or not a safetensors file ({e})",
                             path=path) from None
    if "qkvlab_checkpoint" not in header or "qkvlab_digest" not in header:
        raise InputFileError(f"checkpoint: {path} is not a qkvlab training checkpoint "
                             "(no qkvlab_checkpoint metadata)", path=path)
    if _digest(tensors) != header["qkvlab_digest"]:
        raise InputFileError(f"checkpoint: {path} is corrupt (tensor digest mismatch)", path=path)
    try:
        meta = json.loads(header["qkvlab_checkpoint"])
    except (json.JSONDecodeError, RecursionError) as e:
        raise InputFileError(f"checkpoint: {path} has malformed metadata ({e})",
                             path=path) from None
    if not isinstance(meta, dict):
        raise InputFileError(f"checkpoint: {path} has malformed metadata (a JSON "
                             f"{type(meta).__name__}, not an object)", path=path)
    if type(meta.get("format")) is not int or meta["format"] != FORMAT:
        raise InputFileError(f"checkpoint: {path} has format {meta.get('format')!r}; "
                             f"this qkvlab reads format {FORMAT}", path=path)
    step, groups, state = meta.get("step"), meta.get("param_groups"), meta.get("state", {})
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 \
            or not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups) \
            or not isinstance(state, dict) or not _state_ok(state):
        raise InputFileError(f"checkpoint: {path} has malformed metadata (step {step!r}, "
                             f"param_groups of type {type(groups).__name__}, state "
                             f"{str(state)[:80]})", path=path)
    bad = [k for k, t in tensors.items() if k.startswith("rng.") and (t.dtype != torch.uint8
                                                                      or t.dim() != 1)]
    if bad:
        raise InputFileError(f"checkpoint: {path}: RNG state {bad[0]} is not a uint8 vector",
                             path=path)
    return tensors, meta


def _state_ok(state: dict) -> bool:
    """The trainer's state, where present: a history of metric records and two counters."""
    num = (int, float)
    return (all(isinstance(r, dict) for r in state.get("history", [])) if isinstance(
        state.get("history", []), list) else False) and all(
        isinstance(state.get(k, 0), num) and not isinstance(state.get(k, 0), bool)
        for k in ("tokens", "train_s"))


def load_checkpoint(path: str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Restore ``model`` (and ``optimizer``) in place; returns ``{step, rng, state}``.

    Raises:
        InputFileError: unreadable file, or parameters/optimizer groups that do not match
            (a ``ValueError``).
    """
    tensors, meta = read_checkpoint(path)
    own = {f"model.{n}": t for n, t in model.named_parameters()}
    own.update({f"model.{n}": b for n, b in model.named_buffers()})
    stored = {k for k in tensors if k.startswith("model.")}
    if stored != set(own):
        missing, extra = sorted(set(own) - stored), sorted(stored - set(own))
        raise InputFileError(f"checkpoint: {path} does not match the model "
                             f"(missing {missing[:5]}, unexpected {extra[:5]})", path=path)
    for k, t in own.items():  # check everything before changing anything
        if tensors[k].shape != t.shape:
            raise InputFileError(f"checkpoint: {path} does not match the model: {k} has shape "
                                 f"{tuple(tensors[k].shape)}, the model wants {tuple(t.shape)}",
                                 path=path)
    if optimizer is not None:
        _check_optimizer(path, optimizer, model, tensors, meta["param_groups"])
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(tensors[k])
    if optimizer is not None:
        _load_optimizer(path, optimizer, model, tensors, meta["param_groups"])
    rng = {k[4:]: t for k, t in tensors.items() if k.startswith("rng.")}
    return {"step": meta["step"], "rng": rng, "state": meta.get("state", {})}


def _check_optimizer(path, optimizer, model, tensors, groups) -> None:
    """The saved groups, hyper-parameters and state tensors fit ``optimizer`` (checked before
    anything is changed: a bad value would otherwise surface steps later, inside AdamW)."""
    names = _param_names(model)
    if len(groups) != len(optimizer.param_groups):
        raise InputFileError(f"checkpoint: {path} has {len(groups)} optimizer groups, "
                             f"the optimizer has {len(optimizer.param_groups)}", path=path)
    for g, saved in zip(optimizer.param_groups, groups):
        if [names[id(p)] for p in g["params"]] != saved.get("params"):
            raise InputFileError(f"checkpoint: {path}: optimizer parameter groups do not match "
                                 "the model", path=path)
        for k, v in saved.items():
            have = g.get(k)
            if k == "params" or have is None:
                continue
            num = (int, float)
            ok = (isinstance(v, list) and isinstance(have, tuple) and len(v) == len(have)
                  and all(isinstance(x, num) and not isinstance(x, bool) for x in v)) \
                if isinstance(have, tuple) else isinstance(v, type(have)) or (
                    isinstance(have, num) and isinstance(v, num) and not isinstance(v, bool))
            if not ok:
                raise InputFileError(f"checkpoint: {path}: optimizer setting {k} = {v!r} does "
                                     f"not fit the optimizer's {have!r}", path=path)
        for p in g["params"]:
            prefix = f"optim.{names[id(p)]}."
            for k, t in tensors.items():
                if k.startswith(prefix) and t.dim() and t.shape != p.shape:
                    raise InputFileError(f"checkpoint: {path}: optimizer state {k} has shape "
                                         f"{tuple(t.shape)}, its parameter {tuple(p.shape)}",
                                         path=path)


def _load_optimizer(path, optimizer, model, tensors, groups) -> None:
    names = _param_names(model)
    for g, saved in zip(optimizer.param_groups, groups):
        for k, v in saved.items():
            if k != "params":
                g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
        for p in g["params"]:
            prefix = f"optim.{names[id(p)]}."
            st = {k[len(prefix):]: t.to(p.device) for k, t in tensors.items()
                  if k.startswith(prefix)}
            if st:
                optimizer.state[p] = st
