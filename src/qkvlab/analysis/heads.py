"""The checkpoints' attention layers as per-head views: ``ModelView`` (every layer of one
checkpoint) and the layout helpers the loaders share. The per-head view itself, ``LayerView``,
is ``qkvlab.attention.view``'s (its module docstring has the shapes): qkvlab's own layers give
it by ``Attention.view()``, and every loader here builds the same record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from qkvlab.attention import repeat_kv
from qkvlab.attention.view import ROLES, WEIGHTS, LayerView
from qkvlab.inputs import InputFileError, check_finite

__all__ = ["ROLES", "WEIGHTS", "LayerView", "ModelView", "from_attention", "from_linear"]


@dataclass
class ModelView:
    """All attention layers of one checkpoint, plus how it was read.

    ``capture``, when set, maps a list of texts to the inputs of every attention layer on those
    texts: ``{layer.name: (x (N, D), s (M, D))}`` in float64, padding removed; the measures use
    it for the CKA of q/k/v activations.

    Every loader's view is built here, so here a view with a NaN or an infinity in any of its
    weights is refused, naming the first (a damaged file, a NaN or zero quantization scale),
    before a measure's eigh or svd meets it.
    """

    name: str
    family: str
    source: str
    layers: list[LayerView]
    notes: list[str] = field(default_factory=list)
    capture: Callable[[list[str]], dict[str, tuple[Tensor, Tensor]]] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise InputFileError(f"{self.source}: no attention layers found", path=self.source)
        check_finite(self.source, ((f"{k} of layer {lay.name}", getattr(lay, k))
                                   for lay in self.layers for k in WEIGHTS), what="weight")
        for lay in self.layers:  # a head with nothing in a projection has no measure
            for k in ("W_Q", "W_K", "W_V", "W_O"):
                w = getattr(lay, k)
                zero = [] if w is None else (w.flatten(1) == 0).all(1).nonzero().flatten().tolist()
                if zero:
                    raise InputFileError(
                        f"{self.source}: weight {k} of layer {lay.name} is all zeros in head "
                        f"{zero[0]} ({len(zero)} of {w.shape[0]} heads), so its measures are "
                        "undefined: a damaged file (an infinite quantization scale, say) or a "
                        "pruned head (refused)", path=self.source)


# ---- layout helpers shared by the loaders ---------------------------------------------------
def heads_in(weight: Tensor, n: int) -> Tensor:
    """nn.Linear weight (n·d, D) of a projection -> per-head (n, D, d)."""
    rows, D = weight.shape
    if rows % n:
        raise ValueError(f"projection: {rows} rows are not divisible by {n} heads")
    return weight.reshape(n, rows // n, D).transpose(1, 2)


def heads_bias(bias: Tensor | None, n: int) -> Tensor | None:
    """Bias (n·d,) -> (n, d)."""
    return None if bias is None else bias.reshape(n, -1)


def heads_out(weight: Tensor, n: int) -> Tensor:
    """nn.Linear weight (D, n·dv) of the output projection -> per-head (n, dv, D)."""
    D, cols = weight.shape
    return weight.T.reshape(n, cols // n, D)


def expand_kv(t: Tensor | None, n_heads: int) -> Tensor | None:
    """(G, ...) -> (H, ...): GQA head j serves query heads j·H/G … (j+1)·H/G − 1."""
    return None if t is None else repeat_kv(t, n_heads, dim=0)


def check_linear(q: tuple, k: tuple, v: tuple, o: tuple, n_heads: int, n_kv_heads: int) -> None:
    """(weight, bias) pairs in nn.Linear layout that fit one attention layer of ``n_heads``
    query and ``n_kv_heads`` key/value heads, checked before any reshape.

    Raises:
        ValueError: which projection does not fit, in words.
    """
    H, G = n_heads, n_kv_heads
    if H < 1 or G < 1 or H % G:
        raise ValueError(f"{H} query heads and {G} key/value heads: each must be at least 1 "
                         "and the key/value heads must divide the query heads")
    for role, (w, b) in zip("qkvo", (q, k, v, o)):
        if w.dim() != 2:
            raise ValueError(f"W_{role.upper()} has shape {tuple(w.shape)}, not a matrix")
        if b is not None and b.numel() != w.shape[0]:
            raise ValueError(f"b_{role.upper()} has {b.numel()} values for {w.shape[0]} outputs")
    D = q[0].shape[1]
    for role, (w, _), n in (("Q", q, H), ("K", k, G), ("V", v, G)):
        if w.shape[1] != D or w.shape[0] % n or w.shape[0] == 0:
            raise ValueError(f"W_{role} has shape {tuple(w.shape)}: expected (heads·d, {D}) "
                             f"with {n} heads")
    if k[0].shape[0] // G != q[0].shape[0] // H:
        raise ValueError(f"W_Q {tuple(q[0].shape)} and W_K {tuple(k[0].shape)} give heads of "
                         "different widths")
    if o[0].shape[0] != D or o[0].shape[1] != H * (v[0].shape[0] // G):
        raise ValueError(f"W_O has shape {tuple(o[0].shape)}, expected "
                         f"({D}, {H * (v[0].shape[0] // G)})")


def from_linear(layer: int, role: str, q: tuple, k: tuple, v: tuple, o: tuple, *, n_heads: int,
                n_kv_heads: int | None = None, name: str = "") -> LayerView:
    """A LayerView from (weight, bias) pairs in nn.Linear layout (out, in); GQA expanded.

    Raises:
        ValueError: shapes that do not fit ``n_heads``/``n_kv_heads`` (see :func:`check_linear`).
    """
    G = n_kv_heads or n_heads
    check_linear(q, k, v, o, n_heads, G)
    return LayerView(
        layer=layer, role=role, name=name,
        W_Q=heads_in(q[0], n_heads), b_Q=heads_bias(q[1], n_heads),
        W_K=expand_kv(heads_in(k[0], G), n_heads), b_K=expand_kv(heads_bias(k[1], G), n_heads),
        W_V=expand_kv(heads_in(v[0], G), n_heads), b_V=expand_kv(heads_bias(v[1], G), n_heads),
        W_O=heads_out(o[0], n_heads), b_O=o[1], n_kv_heads=G)


def from_attention(att, layer: int, role: str, name: str = "") -> LayerView:
    """A LayerView of a qkvlab ``Attention`` module (``Attention.view``)."""
    return att.view(layer, role, name)


def fold_qk_norm(lay: LayerView, g_q: Tensor, g_k: Tensor) -> LayerView:
    """Fold per-head q/k norm gains (d_head,) into W_Q, W_K (and their biases).

    With q = RMSNorm(x W_Q)·g_q and k = RMSNorm(s W_K)·g_k (Gemma-3), the score of tokens i, j
    is (x_i W_Q diag(g_q))·(s_j W_K diag(g_k)) / (r_i r_j) with r the per-token RMS of the raw
    projections: the folded W_Q W_K^T is the bilinear form up to positive per-token factors.
    """
    g_q, g_k = g_q.to(torch.float64), g_k.to(torch.float64)
    return LayerView(layer=lay.layer, role=lay.role, name=lay.name, n_kv_heads=lay.n_kv_heads,
                     W_Q=lay.W_Q * g_q, W_K=lay.W_K * g_k, W_V=lay.W_V, W_O=lay.W_O,
                     b_Q=None if lay.b_Q is None else lay.b_Q * g_q,
                     b_K=None if lay.b_K is None else lay.b_K * g_k, b_V=lay.b_V, b_O=lay.b_O)
