"""Slow float64 oracle: attention head by head, query by query, from the public per-head view.

It reads only what analysis reads, the per-head view ``Attention.view()`` gives
(``qkvlab.attention.view.LayerView``, the record the analysis loaders build too):

    q_h = x @ W_Q[h] + b_Q[h]       W_Q (H, D, dk)   b_Q (H, dk)
    k_h = s @ W_K[h] + b_K[h]       W_K (H, D, dk)   b_K (H, dk)    GQA already expanded
    v_h = s @ W_V[h] + b_V[h]       W_V (H, D, dv)   b_V (H, dv)    GQA already expanded
    z_h = softmax(inner · q_h k_hᵀ + mask) v_h
    out = Σ_h z_h @ W_O[h] + b_O    W_O (H, dv, D)   b_O (D,)

and from the config only the inner scale (``scale``: 1/√dk inside the softmax for ``inside`` and
``both``) and ``self_mask``. By its contract ``W_O`` is each head's *effective* output map: it
already holds what a design applies between the softmax and W_O (``alt``'s W_hᵀ, the outer
1/√dk of ``outside`` and ``both``), so the oracle reads no ``W_mix`` and applies no outer scale.

Nothing here knows how a design stores its weights: a wrong slice in a view, a K/V head paired
with the wrong query heads or a W_O that misses ``alt``'s matrix fails the common suite, and a
new design needs nothing here. Dropout must be off (``eval()`` or ``dropout=0``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from qkvlab.attention.view import LayerView


def check_view(view: LayerView, cfg) -> None:
    """The view's shapes as documented, from the config (not from the view itself)."""
    H, D, dk, dv = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_v
    want = dict(W_Q=(H, D, dk), W_K=(H, D, dk), W_V=(H, D, dv), W_O=(H, dv, D),
                b_Q=(H, dk), b_K=(H, dk), b_V=(H, dv), b_O=(D,))
    for name, shape in want.items():
        t = getattr(view, name)
        assert t is None or tuple(t.shape) == shape, f"{name}: {tuple(t.shape)} != {shape}"


def _proj(inp: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    """(T, D) @ (D, d) (+ (d,)) -> (T, d)."""
    y = inp @ W
    return y if b is None else y + b


def reference_attention(att, x, source=None, *, causal=False, allowed=None, additive=None,
                        q_offset=0, view: LayerView | None = None, need_weights=False):
    """Output (B, Tq, D) in float64, and with ``need_weights`` the weights (B, H, Tq, Tk).

    ``allowed``: bool (B, Tq, Tk) or None; ``additive``: float (B, Tq, Tk) or None.
    ``view``: the weights to use, by default ``att.view()``; pass ``att.view().leaves()`` to
    get each role's gradient, or ``att.view(grad=True)`` to backpropagate through the view
    into ``att``'s parameters. Only ``att.cfg`` is read besides.
    """
    cfg = att.cfg
    assert not (att.training and cfg.dropout > 0), "the oracle has no dropout"
    view = att.view() if view is None else view
    check_view(view, cfg)
    x = x.double()
    src = x if source is None else source.double()
    B, Tq, _ = x.shape
    Tk = src.shape[1]
    inner = 1 / math.sqrt(cfg.d_head) if cfg.scale in ("inside", "both") else 1.0
    outs, weights = [], []
    for bi in range(B):
        out = torch.zeros(cfg.d_model, dtype=torch.float64) if view.b_O is None else view.b_O
        w_b = []
        for h in range(cfg.n_heads):
            q = _proj(x[bi], view.W_Q[h], None if view.b_Q is None else view.b_Q[h])  # (Tq, dk)
            k = _proj(src[bi], view.W_K[h], None if view.b_K is None else view.b_K[h])  # (Tk, dk)
            v = _proj(src[bi], view.W_V[h], None if view.b_V is None else view.b_V[h])  # (Tk, dv)
            rows = []
            for i in range(Tq):
                ok = torch.ones(Tk, dtype=torch.bool)
                if causal:
                    ok &= torch.arange(Tk) <= q_offset + i
                if allowed is not None:
                    ok &= allowed[bi, i]
                if cfg.self_mask and source is None and ok.sum() > 1:
                    ok[q_offset + i] = False  # Reformer: own position only as a last resort
                scores = (k @ q[i]) * inner  # (Tk,)
                if additive is not None:
                    scores = scores + additive[bi, i]
                rows.append(torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=0))
            p = torch.stack(rows)  # (Tq, Tk)
            out = out + (p @ v) @ view.W_O[h]  # (Tq, dv) @ (dv, D)
            w_b.append(p)
        outs.append(out)
        weights.append(torch.stack(w_b))  # (H, Tq, Tk)
    out = torch.stack(outs)  # (B, Tq, D)
    return (out, torch.stack(weights)) if need_weights else out
