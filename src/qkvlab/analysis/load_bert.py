"""BERT / RoBERTa / MiniLM encoders from an HF folder (config.json + safetensors).

HF layout per layer ``encoder.layer.{i}.attention``: ``self.query|key|value`` are nn.Linear
(H·dk, D) with biases, ``output.dense`` is (D, H·dv). Post-norm: the attention input is the
residual stream itself.
"""

from __future__ import annotations

from pathlib import Path

from qkvlab.analysis._capture import capture_inputs
from qkvlab.analysis._files import CheckpointError, read_json, read_tensors, safetensors_files, take
from qkvlab.analysis.heads import ModelView, from_linear

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")


def load_bert(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Every self-attention layer of an HF BERT-family folder as a ModelView (role ``encoder``).

    Raises:
        CheckpointError: missing/corrupt files, a config that is not BERT-like, missing tensors.
    """
    folder = Path(folder)
    cfg = read_json(folder / "config.json")
    if cfg.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"{folder}: model_type {cfg.get('model_type')!r} is not one of "
                              f"{list(MODEL_TYPES)}")
    try:
        H, L = int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}/config.json: missing or bad field {e}") from None
    files = safetensors_files(folder)
    t = read_tensors(files)
    # Checkpoints saved from BertForX carry a "bert." / "roberta." prefix; BertModel none.
    anchor = next((k for k in t if k.endswith("encoder.layer.0.attention.self.query.weight")), None)
    if anchor is None:
        raise CheckpointError(f"{files[0]}: no encoder.layer.0.attention.self.query.weight; "
                              "not a BERT-family checkpoint")
    pre = anchor[: -len("encoder.layer.0.attention.self.query.weight")]

    def wb(p):
        return take(t, f"{p}.weight", files[0]), t.get(f"{p}.bias")

    layers = []
    for i in range(L):
        a = f"{pre}encoder.layer.{i}.attention"
        layers.append(from_linear(i, "encoder", wb(f"{a}.self.query"), wb(f"{a}.self.key"),
                                  wb(f"{a}.self.value"), wb(f"{a}.output.dense"), n_heads=H,
                                  name=f"encoder.{i}"))
    view = ModelView(name=name or folder.name, family="bert", source=str(folder), layers=layers,
                     meta={"model_type": cfg["model_type"], "init_std": cfg.get("initializer_range")})
    view.capture = lambda texts: _capture(folder, texts)
    return view


def _capture(folder: Path, texts: list[str]):
    """Attention inputs on ``texts`` from transformers' own BertModel (no remote code)."""
    from transformers import AutoModel, AutoTokenizer  # lazy: optional extra [analysis]

    model = AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    mods = {f"encoder.{i}": lay.attention.self for i, lay in enumerate(model.encoder.layer)}
    return capture_inputs(model, tok, mods, texts)
