"""Slow float64 oracle: attention computed head by head, query by query, from raw parameters.

Independent of the production code path: it re-derives each design's weight layout from
the design name, loops over heads and builds masks element by element.
"""

from __future__ import annotations

import math

import torch

# Order of the fused projection's blocks per design (which roles share a block).
LAYOUT = {
    "standard": ("q", "k", "v"),
    "alt": ("q", "k", "v"),
    "tied_qk": ("qk", "v"),
    "tied_kv": ("q", "kv"),
    "tied_qkv": ("qkv",),
}


def _blocks(cfg):
    """role -> (start row, rows per head, n heads) in W_in."""
    out, start = {}, 0
    for block in LAYOUT[cfg.design]:
        n = cfg.n_heads if "q" in block else cfg.n_kv_heads
        d = cfg.d_v if block == "v" else cfg.d_head
        for role in block:
            out[role] = (start, d, n)
        start += n * d
    return out


def reference_attention(att, x, source=None, *, causal=False, allowed=None, additive=None,
                        q_offset=0):
    """Output (B, Tq, D) in float64.

    ``allowed``: bool (B, Tq, Tk) or None; ``additive``: float (B, Tq, Tk) or None.
    """
    cfg = att.cfg
    x = x.double()
    src = x if source is None else source.double()
    W = att.W_in.detach().double()
    b = None if att.b_in is None else att.b_in.detach().double()
    Wo = att.out_proj.weight.detach().double()
    bo = None if att.out_proj.bias is None else att.out_proj.bias.detach().double()
    blocks = _blocks(cfg)
    B, Tq, D = x.shape
    Tk = src.shape[1]
    H, G = cfg.n_heads, cfg.n_kv_heads
    inner = 1 / math.sqrt(cfg.d_head) if cfg.scale in ("inside", "both") else 1.0
    outer = 1 / math.sqrt(cfg.d_head) if cfg.scale in ("outside", "both") else 1.0
    out = torch.zeros(B, Tq, D, dtype=torch.float64)

    def proj(role, h, inp):
        start, d, n = blocks[role]
        hh = h if n == H else h // (H // G)
        rows = slice(start + hh * d, start + (hh + 1) * d)
        y = inp @ W[rows].T
        return y if b is None else y + b[rows]

    for bi in range(B):
        for h in range(H):
            q, k, v = proj("q", h, x[bi]), proj("k", h, src[bi]), proj("v", h, src[bi])
            z = torch.zeros(Tq, cfg.d_v, dtype=torch.float64)
            for i in range(Tq):
                scores = torch.empty(Tk, dtype=torch.float64)
                ok = torch.ones(Tk, dtype=torch.bool)
                for j in range(Tk):
                    scores[j] = (q[i] @ k[j]) * inner
                    if causal and j > q_offset + i:
                        ok[j] = False
                    if allowed is not None and not allowed[bi, i, j]:
                        ok[j] = False
                    if additive is not None:
                        scores[j] += additive[bi, i, j]
                if cfg.self_mask and source is None and ok.sum() > 1 and ok[q_offset + i]:
                    ok[q_offset + i] = False  # Reformer: own position only as a last resort
                p = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=0)
                z[i] = p @ v
            if cfg.design == "alt":
                z = z @ att.W_mix.detach().double()[h].T
            z = z * outer
            out[bi] += z @ Wo[:, h * cfg.d_v:(h + 1) * cfg.d_v].T
        if bo is not None:
            out[bi] += bo
    return out
