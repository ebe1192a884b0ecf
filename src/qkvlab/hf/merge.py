"""Merging kv heads into fewer (GQA, MQA: ``tie(kind="gqa")``), from one of two starts:

- ``mean_pool`` (Ainslie et al., "GQA", 2023): each group's W_K and W_V rows averaged;
- ``fitted``: the keys mean-pooled as above, the values fitted. Per group of r kv heads with
  value rows V_1 … V_r [d_head, D], the shared value projection is the group's top-d_head
  principal subspace of their values on the calibration activations: with the stacked values
  V = [V_1; …; V_r] and C = E[x̂ x̂ᵀ], U [r·d_head, d_head] the top eigenvectors of V C Vᵀ,
  V_g = Uᵀ V and V_j ≈ U_j V_g (U_j: head j's block of U, the least-squares map, since U is
  orthonormal), so U_j is folded into W_O of the q heads that read head j
  (W_O,h ← W_O,h U_j). That is the least error ‖V − U U_g‖ any shared projection of
  d_head dimensions allows, measured after each head's own map. The keys stay mean-pooled:
  rotary rotates each key after its projection, and a per-head map folded into W_Q would not
  commute with the rotation.
"""

from __future__ import annotations

import torch
from torch import nn

from qkvlab.hf.projections import TieError, TieRefused, _metric, _rows, _shape, _write


def _linear(old: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    new = nn.Linear(old.in_features, rows.shape[0], bias=old.bias is not None,
                    device=old.weight.device, dtype=old.weight.dtype)
    _write(new, rows)
    return new


def fit_values(V: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(V_g [G, d, D], U [G, r, d, d]) for value rows V [G, r, d, D] grouped G × r under C:
    the shared rows of each group and each head's map, V[g, j] ≈ U[g, j] V_g[g]."""
    G, r, d, D = V.shape
    stacked = V.reshape(G, r * d, D)
    _, vecs = torch.linalg.eigh(stacked @ C @ stacked.transpose(1, 2))   # ascending
    U = vecs[..., -d:].flip(-1)                                           # [G, r·d, d]
    return U.transpose(1, 2) @ stacked, U.reshape(G, r, d, d)


def merge_kv_heads(attn: nn.Module, kv_heads: int, C: torch.Tensor | None = None) -> None:
    """Merge consecutive kv heads into ``kv_heads`` groups: mean-pooled, or with ``C`` (the
    layer's calibration moment) the values fitted and folded into W_O (module docstring)."""
    n_heads, n_kv, d_head = _shape(attn)
    if n_kv == 1:
        raise TieRefused("gqa: the model already has a single kv head (MQA); there are no kv heads "
                       "to merge")
    if kv_heads >= n_kv or n_kv % kv_heads:
        raise TieError(f"kv_heads: {kv_heads} must divide the model's {n_kv} kv heads and be fewer")
    r = n_kv // kv_heads
    k, v = _rows(attn.k_proj), _rows(attn.v_proj)
    keys = k.view(kv_heads, r, d_head, -1).mean(1).reshape(kv_heads * d_head, -1)
    if C is None:
        values = v.view(kv_heads, r, d_head, -1).mean(1).reshape(kv_heads * d_head, -1)
    else:
        shared, U = fit_values(v.view(kv_heads, r, d_head, -1), _metric(attn, C))
        values = shared.reshape(kv_heads * d_head, -1)
        o = attn.o_proj.weight
        W_O = o.detach().double().cpu().view(-1, n_heads, d_head)          # [d_model, h, d_head]
        U_h = U.reshape(n_kv, d_head, d_head).repeat_interleave(n_heads // n_kv, 0)
        o.data.copy_(torch.einsum("dhe,hef->dhf", W_O, U_h).reshape(o.shape).to(o))
    attn.k_proj, attn.v_proj = _linear(attn.k_proj, keys), _linear(attn.v_proj, values)
    attn.num_key_value_groups = n_heads // kv_heads
