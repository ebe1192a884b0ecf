"""qkvlab's own models: a safetensors checkpoint with its config in the metadata, or a run folder.

Reads the per-head view each ``Attention`` exposes (``W_Q``… GQA expanded, ``W_O`` effective,
so ``alt``'s extra matrix is folded in) through ``model.attention_layers()``.
"""

from __future__ import annotations

from pathlib import Path

from qkvlab.inputs import InputFileError, check_finite
from qkvlab.analysis.heads import ModelView, from_attention
from qkvlab.models import load_model

_ROLE = {"self": "decoder"}  # models may call a plain self-attention "self"


def find_checkpoint(path: Path) -> Path:
    """The checkpoint file itself, or the newest ``*.safetensors`` inside a run folder."""
    if path.is_file():
        return path
    files = sorted(path.rglob("*.safetensors"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise InputFileError(f"{path}: no qkvlab checkpoint (*.safetensors) in this folder")
    return files[-1]


def load_qkvlab(path: str | Path, *, name: str | None = None) -> ModelView:
    """Every attention layer of a qkvlab checkpoint, with its role (encoder, decoder, cross).

    Raises:
        InputFileError: missing, corrupt or not a qkvlab checkpoint.
    """
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: no such file or folder")
    ckpt = find_checkpoint(path)
    try:
        model = load_model(ckpt)
    except ValueError as e:  # load_model reports corrupt files and config mismatches this way
        hint = ("; for a Hugging Face checkpoint pass its folder (with config.json)"
                if "no qkvlab_config" in str(e) else "")
        raise InputFileError(f"{e}{hint}") from None
    check_finite(ckpt, model.state_dict().items())  # the whole model: it is all in hand
    layers = []
    for lname, role, att in model.attention_layers():
        # names look like "3.attn", "encoder.3.attn", "decoder.3.cross": the first int is the layer
        idx = next(int(p) for p in lname.split(".") if p.isdigit())
        role = _ROLE.get(role, role)
        layers.append(from_attention(att, idx, role, name=f"{role}.{idx}"))
    cfg = model.cfg
    designs = sorted({cfg.attention(r).design for r in {lay.role for lay in layers}})
    return ModelView(name=name or ckpt.stem, family="qkvlab", source=str(ckpt), layers=layers,
                     meta={"kind": model.kind, "designs": designs, "init_std": cfg.init_std})
