"""Build models by kind, and save/load them as safetensors with their config inside.

A checkpoint is one ``.safetensors`` file whose metadata holds ``qkvlab_kind`` and
``qkvlab_config`` (JSON). Tied parameters (embeddings, tied attention roles) are stored once.
Nothing is unpickled; a file that does not fit its config is an
:class:`~qkvlab.inputs.InputFileError` before any weight is allocated.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import nn

from qkvlab.fileio import atomic_write
from qkvlab.inputs import InputFileError, check_memory
from qkvlab.models.config import ModelConfig
from qkvlab.models.encoder import Encoder, EncoderDecoder
from qkvlab.models.lm import DecoderLM

KINDS: dict[str, type[nn.Module]] = {"decoder": DecoderLM, "encoder": Encoder,
                                     "encdec": EncoderDecoder}
# dtypes a checkpoint's tensors may have (the model is cast to the first one's)
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16}


def build_model(cfg: ModelConfig, kind: str = "decoder") -> nn.Module:
    """A fresh model of ``kind`` (``decoder``, ``encoder`` or ``encdec``).

    Raises:
        ValueError: an unknown kind, or a model whose float32 weights alone would pass the
            memory limit (:func:`qkvlab.inputs.memory_limit`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {list(KINDS)}")
    if torch.get_default_device().type != "meta":
        check_memory("model", 4 * estimate_params(cfg, kind), f"a {kind} of this config")
    return KINDS[kind](cfg)


def estimate_params(cfg: ModelConfig, kind: str = "decoder") -> int:
    """An upper bound on the parameters of ``build_model(cfg, kind)``, by arithmetic alone
    (no module is built): embeddings untied, every projection and bias counted."""
    D, F = cfg.d_model, cfg.d_mlp
    roles = {"decoder": ("decoder",), "encoder": ("encoder",),
             "encdec": ("encoder", "decoder", "cross")}[kind]
    per_layer = 0
    for role in roles:
        a = cfg.attention(role)
        H, G = a.n_heads, a.n_kv_heads
        per_layer += D * (H + 2 * G) * max(a.d_head, a.d_v) + H * a.d_v * D  # Q, K, V, W_O
        per_layer += H * a.d_v * a.d_v + (H + 2 * G) * max(a.d_head, a.d_v) + D  # mix, biases
        per_layer += 2 * D * F + F + 5 * D  # MLP and norms
    return per_layer * cfg.n_layers + 2 * cfg.d_vocab * D + 2 * cfg.n_ctx * D + 4 * D


def save_model(model: nn.Module, path: str | os.PathLike,
               extra: dict[str, str] | None = None) -> Path:
    """Write ``model`` to ``path`` atomically (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"qkvlab_kind": model.kind, "qkvlab_config": model.cfg.to_json(), **(extra or {})}
    return atomic_write(path, lambda tmp: safetensors.torch.save_model(model, tmp, metadata=meta))


def _header(path: Path) -> tuple[dict[str, str], dict[str, tuple[str, tuple[int, ...]]]]:
    """(metadata, {name: (dtype, shape)}) of a safetensors file, read without its tensors.
    The safetensors library checks the header against the file: every tensor's offsets lie
    inside it and match its dtype and shape."""
    if not path.is_file():
        raise InputFileError(f"checkpoint: {path} does not exist", path=path)
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {}
            for k in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                sl = f.get_slice(k)
                tensors[k] = (sl.get_dtype(), tuple(sl.get_shape()))
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise InputFileError(f"checkpoint: {path} is not a readable safetensors file ({e})",
                             path=path) from None
    return meta, tensors


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of a qkvlab safetensors checkpoint.

    Raises:
        InputFileError: missing, unreadable, or not a qkvlab checkpoint.
    """
    path = Path(path)
    meta, _ = _header(path)
    if "qkvlab_config" not in meta:
        raise InputFileError(f"checkpoint: {path} has no qkvlab_config metadata (not a qkvlab "
                             "model)", path=path)
    return meta


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model saved at ``path`` (config from its metadata), ties restored.

    The config is a claim: before anything is allocated, the model it describes is built on
    the meta device (no memory) and every tensor it needs is checked against the file's header
    (names, shapes, one float dtype), so a small file cannot ask for a large model.

    Raises:
        InputFileError: missing, corrupt, not a qkvlab checkpoint, a config that does not
            validate, tensors that do not match it, or a model above the memory limit.
    """
    path = Path(path)
    meta, stored = _header(path)
    if "qkvlab_config" not in meta:
        raise InputFileError(f"checkpoint: {path} has no qkvlab_config metadata (not a qkvlab "
                             "model)", path=path)
    kind = meta.get("qkvlab_kind", "decoder")
    try:
        cfg = ModelConfig.from_dict(json.loads(meta["qkvlab_config"]))
        if kind not in KINDS:
            raise ValueError(f"qkvlab_kind: {kind!r} is not one of {list(KINDS)}")
    except (json.JSONDecodeError, RecursionError, ValueError, TypeError) as e:
        raise InputFileError(f"checkpoint: {path} has a malformed qkvlab_config ({e})",
                             path=path) from None
    # arithmetic first (an upper bound, within 2x): a config far beyond the file's values is
    # refused before even the meta model, whose build time grows with its layers
    values, bound = (sum(math.prod(shape) for _, shape in stored.values()),
                     estimate_params(cfg, kind))
    if bound > 4 * values + 4096:
        raise InputFileError(f"checkpoint: {path}: its config describes a {kind} of up to "
                             f"{bound:,} parameters; the file holds {values:,} values", path=path)
    with torch.device("meta"):  # shapes only: no memory, no random draws
        want = KINDS[kind](cfg)
    _check_tensors(path, want, stored)
    dtype = FLOAT_DTYPES[next(iter(stored.values()))[0]] if stored else torch.float32
    size = torch.tensor([], dtype=dtype).element_size()
    check_memory(path, max(4, size) * sum(p.numel() for p in want.parameters()),
                 f"the {kind} its config describes")
    model = build_model(cfg, kind)
    model = model.to(dtype)  # keep the stored precision (a float64 model loads as float64)
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(path), strict=False)
    except Exception as e:
        raise InputFileError(f"checkpoint: {path} could not be loaded ({e})", path=path) from None
    if missing or unexpected:
        raise InputFileError(f"checkpoint: {path} does not match its config "
                             f"(missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]})", path=path)
    return model


def _check_tensors(path: Path, model: nn.Module, stored: dict) -> None:
    """Every tensor of ``model`` (a tied one under any of its names) is in ``stored`` with its
    shape, nothing else is, and all share one float dtype."""
    names: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for n, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(n)
        shapes[id(t)] = tuple(t.shape)
    known = {n for ns in names.values() for n in ns}
    extra = sorted(set(stored) - known)
    if extra:
        raise InputFileError(f"checkpoint: {path} does not match its config (unexpected "
                             f"tensors {extra[:5]})", path=path)
    for key, ns in names.items():
        held = [n for n in ns if n in stored]
        if not held:
            raise InputFileError(f"checkpoint: {path} does not match its config (missing "
                                 f"{ns[0]!r})", path=path)
        for n in held:
            if stored[n][1] != shapes[key]:
                raise InputFileError(f"checkpoint: {path}: tensor {n!r} has shape "
                                     f"{list(stored[n][1])}; its config implies "
                                     f"{list(shapes[key])}", path=path)
    dtypes = {d for d, _ in stored.values()}
    if len(dtypes) > 1 or not dtypes <= set(FLOAT_DTYPES):
        raise InputFileError(f"checkpoint: {path} holds tensors of dtypes {sorted(dtypes)}; "
                             f"a qkvlab model is one of {sorted(FLOAT_DTYPES)}", path=path)
