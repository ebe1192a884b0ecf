"""The designs side by side: each attention layer's forward+backward time against
``standard``, each design's KV-cache bytes, and ``fold_alt`` on a trained ``alt`` model (the
fourth matrix adds cost, not expressivity)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkvlab.attention import DESIGNS
from qkvlab.bench.workload import SIZES, VOCAB, bigram_batches
from qkvlab.models import DecoderLM, ModelConfig
from qkvlab.models.speed import attention_layer_speed, fold_compare


def bench_attention(size: str = "large", iters: int = 5, rounds: int = 5, device: str = "cpu",
                    log=print) -> dict[str, dict]:
    """Forward+backward time of each design's layer relative to ``standard`` (causal, fp32)."""
    s = SIZES[size]
    log(f"attention layer fwd+bwd, size {size}, {device}")
    return attention_layer_speed(s.d_model, s.n_heads, s.n_ctx, s.batch, iters=iters,
                                 rounds=rounds, device=device)


def cache_bytes_table(size: str = "large") -> dict[str, int]:
    """KV-cache bytes per token (all layers, fp32) per design, plus GQA/MQA references."""
    s = SIZES[size]
    out = {}
    variants = [(d, None) for d in DESIGNS] + [("standard", s.n_heads // 2), ("standard", 1)]
    for d, g in variants:
        cfg = ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model, n_layers=s.n_layers,
                          n_heads=s.n_heads, design=d, n_kv_heads=g)
        with torch.device("meta"):
            model = DecoderLM(cfg)
        name = d if g is None else f"standard GQA G={g}"
        out[name] = sum(c.nbytes for c in model.new_caches(1, 1))
    return out


def bench_fold_alt(size: str = "small", train_steps: int = 200, rounds: int = 5, seed: int = 0,
                   log=print) -> dict[str, float]:
    """Train an ``alt`` DecoderLM briefly, fold it into ``standard``, and compare.

    The training data is a fixed random bigram language (so the model learns something real
    and the weights are no longer at init). Reports the max |logit difference| after folding
    in fp32 and fp64, both parameter counts, and the forward speed ratio folded / alt.
    """
    s = SIZES[size]
    data = bigram_batches(s, train_steps + 1, seed)
    torch.manual_seed(seed)
    alt = DecoderLM(ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model,
                                n_layers=s.n_layers, n_heads=s.n_heads, design="alt"))
    opt = torch.optim.AdamW(alt.parameters(), lr=3e-3)
    first = last = None
    for idx in data[:-1]:
        loss = F.cross_entropy(alt(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    alt.eval()
    log(f"fold_alt, size {size}: trained {train_steps} steps, loss {first:.3f} -> {last:.3f}")
    return {"train_loss_first": first, "train_loss_last": last,
            **fold_compare(alt, data[-1][:, :-1], rounds)}
