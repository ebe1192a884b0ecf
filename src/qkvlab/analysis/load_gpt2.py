"""GPT-2 from an HF folder: fused ``c_attn`` in Conv1D layout.

Conv1D stores (in, out) and computes x @ W + b, the transpose of nn.Linear. ``h.{i}.attn.c_attn``
is (D, 3D) = [W_Q | W_K | W_V] along the output axis; ``c_proj`` is (D, D) mapping the
concatenated heads back to the residual stream.
"""

from __future__ import annotations

from pathlib import Path

from qkvlab.analysis._capture import capture_inputs, hf_model
from qkvlab.analysis._files import (
    as_input_error,
    check_layers,
    config_int,
    count_layers,
    read_json,
    read_tensors,
    safetensors_files,
    take,
)
from qkvlab.inputs import InputFileError
from qkvlab.analysis.heads import ModelView, from_linear


def load_gpt2(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Every causal self-attention layer of an HF GPT-2 folder (role ``decoder``).

    Raises:
        InputFileError: missing/corrupt files or tensors, a config that is not GPT-2.
    """
    folder = Path(folder)
    where = folder / "config.json"
    cfg = read_json(where)
    if cfg.get("model_type") != "gpt2":
        raise InputFileError(f"{folder}: model_type {cfg.get('model_type')!r} is not 'gpt2'")
    H = config_int(cfg, "n_head", where, bound="heads")
    L = config_int(cfg, "n_layer", where, bound="layers")
    D = config_int(cfg, "n_embd", where, bound="width")
    if D % H:
        raise InputFileError(f"{where}: n_embd {D} is not divisible by n_head {H}")
    files = safetensors_files(folder)
    t = read_tensors(files)
    anchor = next((k for k in t if k.endswith("h.0.attn.c_attn.weight")), None)
    if anchor is None:
        raise InputFileError(f"{files[0]}: no h.0.attn.c_attn.weight; not a GPT-2 checkpoint")
    pre = anchor[: -len("h.0.attn.c_attn.weight")]
    check_layers(where, L, count_layers(t, lambda i: f"{pre}h.{i}.attn.c_attn.weight"), "n_layer")
    layers = []
    for i in range(L):
        a = f"{pre}h.{i}.attn"
        W = take(t, f"{a}.c_attn.weight", files[0], ndim=2).T  # Conv1D (D, 3D) -> Linear (3D, D)
        b = take(t, f"{a}.c_attn.bias", files[0], ndim=1)
        Wo = take(t, f"{a}.c_proj.weight", files[0], ndim=2).T
        bo = take(t, f"{a}.c_proj.bias", files[0], ndim=1)
        if W.shape != (3 * D, D) or b.shape != (3 * D,):
            raise InputFileError(f"{files[0]}: {a}.c_attn has weight {tuple(W.T.shape)} and "
                                  f"bias {tuple(b.shape)}, expected ({D}, {3 * D}) and ({3 * D},)")
        q, k, v = ((W[j * D:(j + 1) * D], b[j * D:(j + 1) * D]) for j in range(3))
        try:
            layers.append(from_linear(i, "decoder", q, k, v, (Wo, bo), n_heads=H,
                                      name=f"decoder.{i}"))
        except ValueError as e:
            raise as_input_error(files[0], f"layer {i}", e) from None
    view = ModelView(name=name or folder.name, family="gpt2", source=str(folder), layers=layers,
                     meta={"model_type": "gpt2", "init_std": cfg.get("initializer_range")})
    stored = sum(x.numel() for x in t.values())
    view.capture = lambda texts: _capture(folder, texts, stored)
    return view


def _capture(folder: Path, texts: list[str], stored: int):
    from transformers import AutoTokenizer  # lazy: optional extra [analysis]

    model = hf_model(folder, stored)  # GPT2Model for model_type gpt2
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    mods = {f"decoder.{i}": blk.attn for i, blk in enumerate(model.h)}
    return capture_inputs(model, tok, mods, texts)
