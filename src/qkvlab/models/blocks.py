"""Pre-LayerNorm transformer blocks shared by every model.

Shapes: x (B, T, D); memory (B, S, D) from the encoder.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkvlab.attention import Attention, KVCache, build_attention
from qkvlab.kernels import Linear
from qkvlab.models.config import ModelConfig


class MLP(nn.Module):
    """D -> d_mlp -> D with GELU: ``cfg.activation`` ``gelu_tanh`` (tanh approximation, as
    GPT-2's ``gelu_new``; the default) or ``gelu`` (exact, as nanoGPT, litgpt and
    x-transformers; on AVX2 CPUs about 2x faster than the tanh form)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = Linear(cfg.d_model, cfg.d_mlp, bias=cfg.bias)
        self.proj = Linear(cfg.d_mlp, cfg.d_model, bias=cfg.bias)
        self.approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), GPT-NeoX "rotate half" layout.

    Called as ``rope(x, offset)`` on x (B, n, T, d) whose first row sits at ``offset``.
    """

    def __init__(self, d_head: int, n_ctx: int, base: float):
        super().__init__()
        inv = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]  # (n_ctx, d/2)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int) -> Tensor:
        T = x.shape[-2]
        cos = self.cos[offset:offset + T].to(x.dtype)
        sin = self.sin[offset:offset + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def maybe_drop(drop: nn.Dropout, x: Tensor) -> Tensor:
    """``drop(x)``, without the module call where it returns ``x`` itself (p = 0 or eval): that
    call's overhead would be paid on every residual branch of every block, per decoded token."""
    return drop(x) if drop.training and drop.p > 0 else x


class Block(nn.Module):
    """x + Attn(LN(x)) [+ Cross(LN(x), memory)] + MLP(LN(x))."""

    def __init__(self, cfg: ModelConfig, self_role: str, cross: bool = False):
        super().__init__()
        self.causal = self_role == "decoder"
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = build_attention(cfg.attention(self_role))
        self.ln_c = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cross else None
        self.cross = build_attention(cfg.attention("cross")) if cross else None
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, *, memory: Tensor | None = None,
                key_padding_mask: Tensor | None = None,
                memory_padding_mask: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: KVCache | None = None,
                rope: Rotary | None = None) -> Tensor:
        x = x + maybe_drop(self.drop, self.attn(self.ln_1(x), is_causal=self.causal, cache=cache,
                                                 key_padding_mask=key_padding_mask, rope=rope))
        if self.cross is not None:
            x = x + maybe_drop(self.drop, self.cross(self.ln_c(x), memory, cache=cross_cache,
                                                      key_padding_mask=memory_padding_mask))
        return x + maybe_drop(self.drop, self.mlp(self.ln_2(x)))


class Embedding(nn.Module):
    """Token embedding plus learned positions (or none, with rotary positions)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: Tensor, offset: int = 0) -> Tensor:
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx: must be an integer tensor (B, T), got {idx.dtype} "
                             f"{tuple(idx.shape)}")
        T = idx.shape[1]
        if offset + T > self.cfg.n_ctx:
            raise ValueError(f"idx: sequence length {offset + T} exceeds n_ctx={self.cfg.n_ctx}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(offset, offset + T, device=idx.device))
        return maybe_drop(self.drop, x)


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """GPT-2 init: N(0, 0.02), residual projections scaled by 1/√(2·layers).

    ``alt``'s per-head W_h keeps its own variance-preserving init.
    """
    std = cfg.init_std
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, Attention):
            nn.init.normal_(m.W_in, std=std)
            if m.b_in is not None:
                nn.init.zeros_(m.b_in)
    res_std = std / math.sqrt(2 * len(blocks))
    for blk in blocks:
        for lin in (blk.attn.out_proj, blk.mlp.proj, blk.cross and blk.cross.out_proj):
            if lin is not None:
                nn.init.normal_(lin.weight, std=res_std)


def rotary_for(cfg: ModelConfig, role: str) -> Rotary | None:
    """The rotary embedding of a role's self-attention, or None with learned positions."""
    if cfg.positions != "rotary":
        return None
    return Rotary(cfg.attention(role).d_head, cfg.n_ctx, cfg.rope_base)


def init_and_tie(model: nn.Module, cfg: ModelConfig) -> None:
    """GPT-2 init, then tie the output layer to the token embedding (one tensor, stored once)."""
    init_weights(model, cfg)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.wte.weight


def attention_modules(blocks: nn.ModuleList, self_role: str):
    """Yield (name, role, Attention) over a stack of blocks."""
    for i, blk in enumerate(blocks):
        yield f"{i}.attn", self_role, blk.attn
        if blk.cross is not None:
            yield f"{i}.cross", "cross", blk.cross

