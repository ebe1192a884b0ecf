"""What every tie reads and writes of one HF attention module: its shapes, its projections as
rows [w, b] in float64 (``_rows``/``_write``), the calibration metric, the shared-query module
a Q=K tie installs, and the two errors a tie raises. ``hf.tie`` (the fits) and ``hf.merge``
(the kv-head merges of GQA/MQA) both build on these; the shapes are ``hf.tie``'s docstring's.
"""

from __future__ import annotations

import torch
from torch import nn


class TieError(ValueError):
    """A tie that cannot be imposed on this model or with these arguments; the message says why."""


class TieRefused(TieError):
    """The model's architecture cannot take this tie at all (not a wrong argument): a fact about
    the model worth reporting, e.g. Q=K under q/k RMSNorm, or GQA on a model with one kv head."""


class SharedQuery(nn.Module):
    """q = k (pre-rotary) for every q head: kv head g's projection repeated for its n_rep q heads.

    Holds ``k_proj`` itself, so the tied model has one Parameter for Q and K.
    """

    def __init__(self, k_proj: nn.Linear, n_rep: int, d_head: int):
        super().__init__()
        self.proj, self.n_rep, self.d_head = k_proj, n_rep, d_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.proj(x).unflatten(-1, (-1, 1, self.d_head))         # (..., n_kv, 1, d_head)
        return k.expand(*k.shape[:-2], self.n_rep, self.d_head).flatten(-3)  # (..., n_heads*d_head)


def _shape(attn: nn.Module) -> tuple[int, int, int]:
    d_head = attn.head_dim
    n_kv = attn.k_proj.out_features // d_head
    q = attn.q_proj
    n_heads = n_kv * q.n_rep if isinstance(q, SharedQuery) else q.out_features // d_head
    return n_heads, n_kv, d_head


def _rows(lin: nn.Linear) -> torch.Tensor:
    """[out, D]: weight with its bias as the last column (zeros when it has none)."""
    if isinstance(lin, SharedQuery):  # the effective Q: each kv head's rows repeated n_rep times
        k = _rows(lin.proj).unflatten(0, (-1, 1, lin.d_head))
        return k.expand(-1, lin.n_rep, -1, -1).flatten(0, 2)
    b = (lin.bias if lin.bias is not None
         else torch.zeros(lin.out_features, device=lin.weight.device))
    return torch.cat([lin.weight.detach().double(), b.detach().double()[:, None]], 1).cpu()


def _write(lin: nn.Linear, rows: torch.Tensor) -> None:
    lin.weight.data.copy_(rows[:, :-1].to(lin.weight))
    if lin.bias is not None:
        lin.bias.data.copy_(rows[:, -1].to(lin.bias))


def _metric(attn: nn.Module, C: torch.Tensor) -> torch.Tensor:
    """C restricted to x when the projections have no bias (the constant 1 then plays no part)."""
    if attn.k_proj.bias is None:
        C = C.clone()
        C[-1, :] = 0
        C[:, -1] = 0
    return C
