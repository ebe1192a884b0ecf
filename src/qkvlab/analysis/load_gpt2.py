"""GPT-2 from an HF folder: fused ``c_attn`` in Conv1D layout.

Conv1D stores (in, out) and computes x @ W + b, the transpose of nn.Linear. ``h.{i}.attn.c_attn``
is (D, 3D) = [W_Q | W_K | W_V] along the output axis; ``c_proj`` is (D, D) mapping the
concatenated heads back to the residual stream.
"""

from __future__ import annotations

from pathlib import Path

from qkvlab.analysis._capture import capture_inputs
from qkvlab.analysis._files import CheckpointError, read_json, read_tensors, safetensors_files, take
from qkvlab.analysis.heads import ModelView, from_linear


def load_gpt2(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Every causal self-attention layer of an HF GPT-2 folder (role ``decoder``).

    Raises:
        CheckpointError: missing/corrupt files or tensors, a config that is not GPT-2.
    """
    folder = Path(folder)
    cfg = read_json(folder / "config.json")
    if cfg.get("model_type") != "gpt2":
        raise CheckpointError(f"{folder}: model_type {cfg.get('model_type')!r} is not 'gpt2'")
    H, L, D = int(cfg["n_head"]), int(cfg["n_layer"]), int(cfg["n_embd"])
    files = safetensors_files(folder)
    t = read_tensors(files)
    anchor = next((k for k in t if k.endswith("h.0.attn.c_attn.weight")), None)
    if anchor is None:
        raise CheckpointError(f"{files[0]}: no h.0.attn.c_attn.weight; not a GPT-2 checkpoint")
    pre = anchor[: -len("h.0.attn.c_attn.weight")]
    layers = []
    for i in range(L):
        a = f"{pre}h.{i}.attn"
        W = take(t, f"{a}.c_attn.weight", files[0]).T  # Conv1D (D, 3D) -> Linear (3D, D)
        b = take(t, f"{a}.c_attn.bias", files[0])
        Wo, bo = take(t, f"{a}.c_proj.weight", files[0]).T, take(t, f"{a}.c_proj.bias", files[0])
        if W.shape != (3 * D, D):
            raise CheckpointError(f"{files[0]}: {a}.c_attn.weight has shape {tuple(W.T.shape)}, "
                                  f"expected ({D}, {3 * D})")
        q, k, v = ((W[j * D:(j + 1) * D], b[j * D:(j + 1) * D]) for j in range(3))
        layers.append(from_linear(i, "decoder", q, k, v, (Wo, bo), n_heads=H, name=f"decoder.{i}"))
    view = ModelView(name=name or folder.name, family="gpt2", source=str(folder), layers=layers,
                     meta={"model_type": "gpt2", "init_std": cfg.get("initializer_range")})
    view.capture = lambda texts: _capture(folder, texts)
    return view


def _capture(folder: Path, texts: list[str]):
    from transformers import AutoTokenizer, GPT2Model  # lazy: optional extra [analysis]

    model = GPT2Model.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    mods = {f"decoder.{i}": blk.attn for i, blk in enumerate(model.h)}
    return capture_inputs(model, tok, mods, texts)
