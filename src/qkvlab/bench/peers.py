"""Peer implementations for ``qkvlab bench``, each with the qkvlab settings that match it.

A peer is built at a benchmark size as ``(loss, model)``: ``loss(x, y)`` is the peer's own
training loss on inputs ``x`` (B, T) and targets ``y`` (B, T), as its training script computes
it. ``MATCHED[peer]`` are the ``ModelConfig`` options under which qkvlab computes the same
kind of model (biases, GELU form, positions, tied embeddings), so each ratio compares like with
like:

==============  ======  ==========  ========  ======================================
peer            biases  GELU        positions  notes
==============  ======  ==========  ========  ======================================
hf_gpt2         yes     tanh        learned   ``GPT2LMHeadModel``, SDPA attention
x_transformers  MLP     exact       learned   attention and LayerNorm without biases
litgpt          yes     exact       rotary    ``litgpt.GPT``, untied unembedding
nanogpt         no      exact       learned   nanoGPT ``model.py``, ``bias=False``
nanogpt_bias    yes     exact       learned   nanoGPT ``model.py``, ``bias=True``
==============  ======  ==========  ========  ======================================

x-transformers has biases in its MLP only: qkvlab runs without any (it does slightly less).
nanoGPT is not on PyPI: :func:`load_nanogpt` imports ``model.py`` from a checkout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from types import ModuleType

import torch.nn.functional as F

MATCHED = {
    "hf_gpt2": {"bias": True, "activation": "gelu_tanh"},
    "x_transformers": {"bias": False, "activation": "gelu"},
    "litgpt": {"bias": True, "activation": "gelu", "positions": "rotary", "tie_embeddings": False},
    "nanogpt": {"bias": False, "activation": "gelu"},
    "nanogpt_bias": {"bias": True, "activation": "gelu"},
}
# The same settings in words, for the bench's training table.
PEER_SETTINGS = {"hf_gpt2": "biases, tanh GELU", "x_transformers": "no biases, exact GELU",
                 "litgpt": "biases, exact GELU, rotary, untied", "nanogpt": "no biases, exact GELU",
                 "nanogpt_bias": "biases, exact GELU"}


def _logits_loss(model):
    return lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def hf_gpt2(s, vocab: int):
    import transformers  # lazy here and below: optional extra [bench]; peers are optional

    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=s.n_ctx, n_embd=s.d_model,
                                  n_layer=s.n_layers, n_head=s.n_heads, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return _logits_loss(lambda x: model(x).logits), model


def x_transformers(s, vocab: int):
    from x_transformers import Decoder, TransformerWrapper

    model = TransformerWrapper(num_tokens=vocab, max_seq_len=s.n_ctx,
                               attn_layers=Decoder(dim=s.d_model, depth=s.n_layers,
                                                   heads=s.n_heads, attn_flash=True))
    return _logits_loss(model), model


def litgpt(s, vocab: int):
    """litgpt's ``GPT`` as GPT-2 with rotary positions: LayerNorm, sequential residual, GELU
    MLP (``GptNeoxMLP``), full-width rotary, biases, no vocabulary padding."""
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(block_size=s.n_ctx, vocab_size=vocab, padded_vocab_size=vocab,
                 n_layer=s.n_layers, n_head=s.n_heads, n_embd=s.d_model, bias=True,
                 rotary_percentage=1.0, parallel_residual=False, norm_class_name="LayerNorm",
                 mlp_class_name="GptNeoxMLP", intermediate_size=4 * s.d_model)
    model = GPT(cfg)
    return _logits_loss(model), model


def load_nanogpt(path: str | Path) -> ModuleType:
    """nanoGPT's ``model.py`` imported from ``path`` (a checkout, or the file itself).

    Raises:
        ValueError: ``path`` has no ``model.py``, or the file defines no ``GPT``/``GPTConfig``.
    """
    p = Path(path)
    f = p / "model.py" if p.is_dir() else p
    if not f.is_file():
        raise ValueError(f"nanogpt: no model.py at {f} (point --nanogpt at a nanoGPT checkout)")
    spec = importlib.util.spec_from_file_location("qkvlab_nanogpt_model", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    missing = [n for n in ("GPT", "GPTConfig") if not hasattr(mod, n)]
    if missing:
        raise ValueError(f"nanogpt: {f} defines no {' or '.join(missing)}; "
                         "is it nanoGPT's model.py?")
    return mod


def nanogpt(mod: ModuleType, bias: bool):
    """A builder of nanoGPT's ``GPT`` (from :func:`load_nanogpt`) with or without biases; its
    loss is ``model(x, y)[1]``, as nanoGPT's ``train.py`` computes it."""
    def build(s, vocab: int):
        cfg = mod.GPTConfig(block_size=s.n_ctx, vocab_size=vocab, n_layer=s.n_layers,
                            n_head=s.n_heads, n_embd=s.d_model, dropout=0.0, bias=bias)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
            model = mod.GPT(cfg)
        return (lambda x, y: model(x, y)[1]), model
    return build


BUILDERS = {"hf_gpt2": hf_gpt2, "x_transformers": x_transformers, "litgpt": litgpt}


def builders(names, nanogpt_path: str | Path | None = None) -> dict:
    """Peer name -> builder for ``names`` plus, with ``nanogpt_path``, both nanoGPT variants."""
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"peers: unknown {unknown}; known: {list(BUILDERS)} "
                         "(nanoGPT: --nanogpt PATH)")
    out = {n: BUILDERS[n] for n in names}
    if nanogpt_path is not None:
        mod = load_nanogpt(nanogpt_path)
        out["nanogpt"], out["nanogpt_bias"] = nanogpt(mod, False), nanogpt(mod, True)
    return out
