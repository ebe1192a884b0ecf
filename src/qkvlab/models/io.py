"""Build models by kind, and save/load them as safetensors with their config inside.

A checkpoint is one ``.safetensors`` file whose metadata holds ``qkvlab_kind`` and
``qkvlab_config`` (JSON). Tied parameters (embeddings, tied attention roles) are stored once.
Nothing is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors
import safetensors.torch
from torch import nn

from qkvlab.fileio import atomic_write
from qkvlab.models.config import ModelConfig
from qkvlab.models.encoder import Encoder, EncoderDecoder
from qkvlab.models.lm import DecoderLM

KINDS: dict[str, type[nn.Module]] = {"decoder": DecoderLM, "encoder": Encoder, "encdec": EncoderDecoder}


def build_model(cfg: ModelConfig, kind: str = "decoder") -> nn.Module:
    """A fresh model of ``kind`` (``decoder``, ``encoder`` or ``encdec``)."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {list(KINDS)}")
    return KINDS[kind](cfg)


def save_model(model: nn.Module, path: str | os.PathLike, extra: dict[str, str] | None = None) -> Path:
    """Write ``model`` to ``path`` atomically (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"qkvlab_kind": model.kind, "qkvlab_config": model.cfg.to_json(), **(extra or {})}
    return atomic_write(path, lambda tmp: safetensors.torch.save_model(model, tmp, metadata=meta))


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of a qkvlab safetensors checkpoint; ``ValueError`` if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint: {path} does not exist")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"checkpoint: {path} is not a readable safetensors file ({e})") from None
    if "qkvlab_config" not in meta:
        raise ValueError(f"checkpoint: {path} has no qkvlab_config metadata (not a qkvlab model)")
    return meta


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model saved at ``path`` (config from its metadata), ties restored."""
    meta = read_metadata(path)
    try:
        cfg = ModelConfig.from_dict(json.loads(meta["qkvlab_config"]))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"checkpoint: {path} has a malformed qkvlab_config ({e})") from None
    model = build_model(cfg, meta.get("qkvlab_kind", "decoder"))
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            if names:  # keep the stored precision (a float64 model loads as float64)
                model = model.to(f.get_tensor(names[0]).dtype)
        missing, unexpected = safetensors.torch.load_model(model, str(path), strict=False)
    except Exception as e:
        raise ValueError(f"checkpoint: {path} could not be loaded ({e})") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint: {path} does not match its config "
                         f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    return model
