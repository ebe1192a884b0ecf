"""Converters between qkvlab models and Hugging Face checkpoints (no remote code).

GPT-2 stores its projections as ``Conv1D`` (weight (in, out)); qkvlab stores ``nn.Linear``
layout (out, in), with Q, K, V fused in the same order as GPT-2's ``c_attn``.
"""

from __future__ import annotations

import torch

from qkvlab.models.config import ModelConfig
from qkvlab.models.lm import DecoderLM


def gpt2_config(hf_config) -> ModelConfig:
    """The qkvlab config of an HF ``GPT2Config`` (standard design, learned positions)."""
    if getattr(hf_config, "model_type", None) != "gpt2":
        raise ValueError(f"hf_config: model_type {getattr(hf_config, 'model_type', None)!r} "
                         "is not 'gpt2'")
    return ModelConfig(d_vocab=hf_config.vocab_size, n_ctx=hf_config.n_positions,
                       d_model=hf_config.n_embd, n_layers=hf_config.n_layer,
                       n_heads=hf_config.n_head, d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
                       bias=True, activation="gelu_tanh", positions="learned", tie_embeddings=True)


@torch.no_grad()
def from_hf_gpt2(hf_model) -> DecoderLM:
    """A ``DecoderLM`` with the weights of an HF ``GPT2LMHeadModel`` (same logits)."""
    cfg = gpt2_config(hf_model.config)
    model = DecoderLM(cfg).to(hf_model.dtype)
    sd = hf_model.state_dict()
    model.embed.wte.weight.copy_(sd["transformer.wte.weight"])
    model.embed.wpe.weight.copy_(sd["transformer.wpe.weight"])
    for i, blk in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        blk.ln_1.weight.copy_(sd[p + "ln_1.weight"])
        blk.ln_1.bias.copy_(sd[p + "ln_1.bias"])
        blk.ln_2.weight.copy_(sd[p + "ln_2.weight"])
        blk.ln_2.bias.copy_(sd[p + "ln_2.bias"])
        blk.attn.W_in.copy_(sd[p + "attn.c_attn.weight"].T)
        blk.attn.b_in.copy_(sd[p + "attn.c_attn.bias"])
        blk.attn.out_proj.weight.copy_(sd[p + "attn.c_proj.weight"].T)
        blk.attn.out_proj.bias.copy_(sd[p + "attn.c_proj.bias"])
        blk.mlp.fc.weight.copy_(sd[p + "mlp.c_fc.weight"].T)
        blk.mlp.fc.bias.copy_(sd[p + "mlp.c_fc.bias"])
        blk.mlp.proj.weight.copy_(sd[p + "mlp.c_proj.weight"].T)
        blk.mlp.proj.bias.copy_(sd[p + "mlp.c_proj.bias"])
    model.ln_f.weight.copy_(sd["transformer.ln_f.weight"])
    model.ln_f.bias.copy_(sd["transformer.ln_f.bias"])
    return model
