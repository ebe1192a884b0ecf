"""GPT-style decoder-only language model (pre-LayerNorm, tied embeddings).

Shapes: idx (B, T) token ids; logits (B, T, V).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from qkvlab.attention import KVCache
from qkvlab.kernels import Linear, attend, gemv
from qkvlab.models.blocks import Block, Embedding, attention_modules, init_and_tie, rotary_for
from qkvlab.models.config import ModelConfig


class DecoderLM(nn.Module):
    """Causal LM: embeddings -> n_layers blocks (role ``decoder``) -> LayerNorm -> unembed."""

    kind = "decoder"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.rope = rotary_for(cfg, "decoder")
        self.blocks = nn.ModuleList(Block(cfg, "decoder") for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = Linear(cfg.d_model, cfg.d_vocab, bias=False)
        init_and_tie(self, cfg)

    def forward(self, idx: Tensor, *, caches: list[KVCache] | None = None,
                key_padding_mask: Tensor | None = None) -> Tensor:
        """Logits (B, T, V) for ``idx`` (B, T); with ``caches`` the tokens extend the cache.

        ``key_padding_mask`` (B, T_total) marks real tokens (True) over cached + new tokens.
        """
        offset = caches[0].length if caches else 0
        x = self.embed(idx, offset)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache=caches[i] if caches else None, rope=self.rope,
                    key_padding_mask=key_padding_mask)
        return self.lm_head(self.ln_f(x))

    def new_caches(self, batch: int, max_len: int | None = None, dtype=None) -> list[KVCache]:
        """One empty KV cache per layer, for up to ``max_len`` (default n_ctx) tokens."""
        n = max_len or self.cfg.n_ctx
        return [blk.attn.new_cache(batch, n, dtype=dtype) for blk in self.blocks]

    def cache_bytes(self, batch: int = 1, max_len: int | None = None) -> int:
        """Bytes the KV cache of the whole model takes for ``batch`` × ``max_len`` tokens."""
        return sum(c.nbytes for c in self.new_caches(batch, max_len))

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, greedy: bool = False,
                 generator: torch.Generator | None = None) -> Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` tokens with the KV cache.

        Greedy (argmax) with ``greedy=True``, else sampled at ``temperature`` from the
        ``top_k`` most likely tokens (all when None). Returns (B, T + max_new_tokens).
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: {max_new_tokens} must be >= 0")
        if idx.shape[1] + max_new_tokens > self.cfg.n_ctx:
            raise ValueError(f"max_new_tokens: prompt {idx.shape[1]} + {max_new_tokens} new "
                             f"exceeds n_ctx={self.cfg.n_ctx}")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature: {temperature} must be > 0 (or use greedy=True)")
        caches = self.new_caches(idx.shape[0], idx.shape[1] + max_new_tokens,
                                 dtype=self.embed.wte.weight.dtype)
        out, step = idx, idx
        # inference mode: no view or version tracking, ~5% faster decoding
        with torch.inference_mode(), self.decoding(idx.shape[0], idx.shape[1] + max_new_tokens):
            for _ in range(max_new_tokens):
                logits = self(step, caches=caches)[:, -1]
                step = pick_next(logits, greedy=greedy, temperature=temperature, top_k=top_k,
                                 generator=generator)
                out = torch.cat([out, step], dim=1)
        return out.clone()  # a normal tensor again: inference tensors cannot enter autograd

    @contextlib.contextmanager
    def decoding(self, batch: int, context: int):
        """The kernels a decode step of ``batch`` sequences of up to ``context`` tokens runs on,
        each measured faster for this model (once, then kept): few-row products
        (``kernels.gemv``) and one-query attention (``kernels.attend``). Only ``generate`` and
        speed measurements of its steps enter it; every other forward stays on PyTorch's ops."""
        kind = attend.decode_attention_kernel(self.blocks[0].attn, batch, context,
                                              rotary=self.rope is not None)
        with gemv.use(gemv.decode_kernel(self, rows=batch)), attend.use(kind):
            yield

    def attention_layers(self):
        """Yield (name, role, Attention) for analysis."""
        yield from attention_modules(self.blocks, "decoder")


def pick_next(logits: Tensor, *, greedy: bool, temperature: float = 1.0,
              top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Next token ids (B, 1) from logits (B, V)."""
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
