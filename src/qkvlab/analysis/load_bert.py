"""BERT / RoBERTa / MiniLM encoders from an HF folder (config.json + safetensors).

HF layout per layer ``encoder.layer.{i}.attention``: ``self.query|key|value`` are nn.Linear
(H·dk, D) with biases, ``output.dense`` is (D, H·dv). Post-norm: the attention input is the
residual stream itself.

MPNet (``model_type`` mpnet) has the same post-norm block under other names:
``encoder.layer.{i}.attention.attn.q|k|v|o``. Its scores add a learned relative position bias
per head (``encoder.relative_attention_bias``, 32 buckets) that does not depend on content:
W_Q, W_K, W_V, W_O are per head as in BERT, and W_QK is the content part of the score.
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

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "mpnet")
# model_type -> (query, key, value, output) module names under encoder.layer.{i}.attention
NAMES = {"mpnet": ("attn.q", "attn.k", "attn.v", "attn.o")}
BERT_NAMES = ("self.query", "self.key", "self.value", "output.dense")
MPNET_NOTE = ("MPNet adds a learned relative position bias per head to the scores (content-"
              "independent); W_QK here is the content part of the score")


def load_bert(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Every self-attention layer of an HF BERT-family folder as a ModelView (role ``encoder``).

    Raises:
        InputFileError: missing/corrupt files, a config that is not BERT-like, missing tensors.
    """
    folder = Path(folder)
    where = folder / "config.json"
    cfg = read_json(where)
    if cfg.get("model_type") not in MODEL_TYPES:
        raise InputFileError(f"{folder}: model_type {cfg.get('model_type')!r} is not one of "
                              f"{list(MODEL_TYPES)}")
    H = config_int(cfg, "num_attention_heads", where, bound="heads")
    L = config_int(cfg, "num_hidden_layers", where, bound="layers")
    D = config_int(cfg, "hidden_size", where, bound="width")
    if D % H:
        raise InputFileError(f"{where}: hidden_size {D} is not divisible by "
                              f"num_attention_heads {H}")
    files = safetensors_files(folder)
    t = read_tensors(files)
    names = NAMES.get(cfg["model_type"], BERT_NAMES)
    # Checkpoints saved from BertForX carry a "bert." / "roberta." prefix; BertModel none.
    probe = f"encoder.layer.0.attention.{names[0]}.weight"
    anchor = next((k for k in t if k.endswith(probe)), None)
    if anchor is None:
        raise InputFileError(f"{files[0]}: no {probe}; not a {cfg['model_type']} checkpoint")
    pre = anchor[: -len(probe)]
    found = count_layers(t, lambda i: f"{pre}encoder.layer.{i}.attention.{names[0]}.weight")
    check_layers(where, L, found, "num_hidden_layers")

    def wb(p):
        return take(t, f"{p}.weight", files[0], ndim=2), t.get(f"{p}.bias")

    layers = []
    for i in range(L):
        a = f"{pre}encoder.layer.{i}.attention"
        try:
            layers.append(from_linear(i, "encoder", *(wb(f"{a}.{n}") for n in names), n_heads=H,
                                      name=f"encoder.{i}"))
        except ValueError as e:
            raise as_input_error(files[0], f"layer {i}", e) from None
    if layers[0].d_model != D:
        raise InputFileError(f"{where}: hidden_size {D}, but the attention weights are "
                              f"{layers[0].d_model} wide")
    mpnet = cfg["model_type"] == "mpnet"
    view = ModelView(name=name or folder.name, family="mpnet" if mpnet else "bert",
                     source=str(folder), layers=layers, notes=[MPNET_NOTE] if mpnet else [],
                     meta={"model_type": cfg["model_type"],
                           "init_std": cfg.get("initializer_range")})
    stored = sum(x.numel() for x in t.values())
    view.capture = lambda texts: _capture(folder, texts, stored)
    return view


def _capture(folder: Path, texts: list[str], stored: int):
    """Attention inputs on ``texts`` from transformers' own BertModel (no remote code)."""
    from transformers import AutoTokenizer  # lazy: optional extra [analysis]

    model = hf_model(folder, stored)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    mods = {f"encoder.{i}": getattr(lay.attention, "attn", None) or lay.attention.self
            for i, lay in enumerate(model.encoder.layer)}
    return capture_inputs(model, tok, mods, texts)
