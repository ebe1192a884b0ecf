"""A converted model on disk: written by ``qkvlab convert --out`` (:func:`save_converted`), loaded
back with its Parameters shared as the tie shares them (:func:`load_converted`)."""

from __future__ import annotations

import json
from pathlib import Path

from qkvlab.hf.basis import fold
from qkvlab.hf.tie import decoder_layers

META = "qkvlab_convert.json"


def save_converted(model, tokenizer, out: str | Path, meta: dict) -> Path:
    """Write config, weights (shared Parameters once; a W_O trained in the untied basis folded
    first, in place), tokenizer and ``qkvlab_convert.json``."""
    import safetensors.torch

    from qkvlab.fileio import atomic_write, atomic_write_text
    out, model = Path(out), fold(model)
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    atomic_write(out / "model.safetensors",
                 lambda p: safetensors.torch.save_model(model, str(p)))
    atomic_write_text(out / META, json.dumps(meta, indent=1))
    return out


def load_converted(folder: str | Path):
    """(model, tokenizer) of a folder written by :func:`save_converted`, its Parameters shared
    again as the tie shares them (a K=V layer's v_proj *is* its k_proj)."""
    import safetensors.torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from qkvlab.hf.tie import SharedQuery
    folder = Path(folder)
    if not (folder / META).is_file():
        raise FileNotFoundError(f"{folder}: no {META}; not a folder written by qkvlab convert")
    from qkvlab.analysis._files import check_hf_folder
    check_hf_folder(folder)  # no code from the folder: refuse auto_map before transformers reads
    meta = json.loads((folder / META).read_text())
    from qkvlab.hf.convert import parse_tie
    kind, _ = parse_tie(meta["tie"])
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    for layer in decoder_layers(model):
        a = layer.self_attn
        if kind in ("qk", "qkv"):
            n_rep = a.q_proj.out_features // a.k_proj.out_features
            if n_rep == 1:
                a.q_proj.weight = a.k_proj.weight
                if a.q_proj.bias is not None:
                    a.q_proj.bias = a.k_proj.bias
            else:
                a.q_proj = SharedQuery(a.k_proj, n_rep, a.head_dim)
        if kind in ("kv", "qkv"):
            a.v_proj.weight = a.k_proj.weight
            if a.v_proj.bias is not None:
                a.v_proj.bias = a.k_proj.bias
    safetensors.torch.load_model(model, folder / "model.safetensors", strict=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return model.eval(), tok


__all__ = ["META", "load_converted", "save_converted"]
