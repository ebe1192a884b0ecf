"""Exact algebra: fold what sits between the softmax and W_O into W_O.

For every head, out = Σ_h c · softmax(s·Q_h K_hᵀ) V_h M_h W_O[h] + b_O, where M_h is ``alt``'s
W_hᵀ (or I) and c the outer scale. Both are linear maps after the attention weights, so
W_O'[h] = c · M_h · W_O[h] gives the same function with a ``standard`` layer:

* exact: ``alt``'s per-head W_h, ``scale="outside"`` and the outer half of ``scale="both"``;
* not foldable into W_O: the *inner* scale s. It multiplies the scores inside the softmax,
  so ``scale="none"`` and ``scale="inside"`` are different functions of the same weights
  (it can be absorbed into W_Q instead, W_Q' = s·W_Q, which reparametrizes — and so trains —
  differently; see the scale probe experiment).

Folding changes the dtype of nothing and rounds once: outputs agree to fp rounding.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from qkvlab.attention.base import Attention
from qkvlab.attention.registry import build_attention


def _folded_config(cfg):
    scale = "inside" if cfg.scale in ("inside", "both") else "none"
    return cfg.replace(design="standard" if cfg.design == "alt" else cfg.design, scale=scale)


@torch.no_grad()
def fold_attention(att: Attention) -> Attention:
    """A layer without post-softmax extras computing the same function as ``att``."""
    new = build_attention(_folded_config(att.cfg)).to(att.W_in.device, att.W_in.dtype)
    new.W_in.copy_(att.W_in)
    if att.b_in is not None:
        new.b_in.copy_(att.b_in)
    cfg = att.cfg
    w_o = att.W_O  # (H, dv, D), already includes M_h and the outer scale
    new.out_proj.weight.copy_(w_o.reshape(cfg.n_heads * cfg.d_v, cfg.d_model).T)
    if att.out_proj.bias is not None:
        new.out_proj.bias.copy_(att.out_proj.bias)
    new.train(att.training)
    return new


def fold_alt(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (an ``Attention`` or a qkvlab model) with every ``alt`` layer, and
    every outer scale, folded into W_O: ``alt`` becomes ``standard`` with the same outputs.

    A model's config is rewritten to match, so the copy saves and loads as a standard model.
    """
    if isinstance(model, Attention):
        return fold_attention(model)
    new = copy.deepcopy(model)
    for parent in list(new.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Attention):
                setattr(parent, name, fold_attention(child))
    cfg = getattr(new, "cfg", None)
    if cfg is not None and hasattr(cfg, "attention"):
        new.cfg = _fold_model_config(cfg)
    return new


def _fold_model_config(cfg):
    """Every role gets its folded design and scale explicitly (simple, and exact)."""
    # late, a real cycle: qkvlab.models imports qkvlab.attention, whose __init__ imports this
    from qkvlab.models.config import ROLES

    folded = {r: _folded_config(cfg.attention(r)) for r in ROLES}
    roles = {r: {**cfg.roles.get(r, {}), "design": f.design, "scale": f.scale}
             for r, f in folded.items()}
    return cfg.replace(design=folded["decoder"].design, scale=folded["decoder"].scale, roles=roles)
