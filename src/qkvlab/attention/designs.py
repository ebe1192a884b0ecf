"""The attention designs from the questions, one small class each, registered by name.

Each class only declares what differs: the segments of its fused projection (which roles
share a weight) and, for ``alt``, the extra per-head matrix. The forward pass is shared
(``qkvlab.attention.base.Attention``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkvlab.attention.base import Attention
from qkvlab.attention.registry import register


@register("standard")
class StandardAttention(Attention):
    """softmax(Q_h K_hᵀ/√d_k)·V_h per head h, heads concatenated, then W_O.

    Q_h = X W_Q[h], K_h = S W_K[h], V_h = S W_V[h] with three separate matrices
    (Vaswani et al. 2017, "Attention Is All You Need"). With ``n_kv_heads`` < ``n_heads``
    this is GQA (MQA at 1): groups of H/G query heads share one key/value head::

        q heads:  0 1 2 3 | 4 5 6 7      (H = 8)
        kv heads:    0    |    1         (G = 2; head h reads kv head h // (H/G))
    """

    segments = ("q", "k", "v")


@register("alt")
class AltAttention(Attention):
    """(1/√d_k)·softmax(Q_h K_hᵀ/√d_k)·V_h·W_hᵀ per head, then W_O ("AttentionAlt", seed 001).

    A learned W_h (d_v × d_v) per head after the values, and the scale both inside and
    outside the softmax. W_h and the outer scale are linear maps right before W_O, so they
    fold into it exactly (``qkvlab.fold_alt``): the extra matrix adds parameters and time,
    not expressivity.
    """

    segments = ("q", "k", "v")
    default_scale = "both"

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if not hasattr(self, "W_mix"):  # the base __init__ calls this before W_mix exists
            self.W_mix = nn.Parameter(torch.empty(self.cfg.n_heads, self.cfg.d_v, self.cfg.d_v))
        # variance-preserving, like the other projections: z W_hᵀ keeps z's scale. Drawn even
        # for mix_init="identity", so every other weight matches the random-init model's.
        nn.init.normal_(self.W_mix, std=self.cfg.d_v ** -0.5)
        if self.cfg.mix_init == "identity":  # W_h·outer = I: the layer computes standard's
            with torch.no_grad():
                eye = torch.eye(self.cfg.d_v, dtype=self.W_mix.dtype) / self.cfg.outer_scale
                self.W_mix.copy_(eye.expand_as(self.W_mix))

    def mix(self, z: Tensor) -> Tensor:
        return torch.einsum("bhtd,hed->bhte", z, self.W_mix)  # z_h @ W_hᵀ

    def mix_matrices(self) -> Tensor:
        return self.W_mix.transpose(-1, -2)


@register("tied_qk")
class TiedQKAttention(Attention):
    """softmax(X W_h (S W_h)ᵀ/√d_k)·S W_V[h]: one matrix W_h = W_Q[h] = W_K[h].

    In self-attention the scores X W_h W_hᵀ Xᵀ are symmetric before masking, so a head cannot
    express a directed relation by its scores alone. Option ``self_mask``: a query may not
    attend to its own position unless it has no other target (Reformer, Kitaev et al. 2020),
    since x·W·Wᵀ·x is usually the largest score of its row.
    """

    segments = ("qk", "v")


@register("tied_kv")
class TiedKVAttention(Attention):
    """softmax(Q_h K_hᵀ/√d_k)·K_h with K_h = V_h = S W_h: one matrix W_h = W_K[h] = W_V[h].

    The KV cache holds one tensor per layer instead of two. Requires d_v = d_head.
    """

    segments = ("q", "kv")


@register("tied_qkv")
class TiedQKVAttention(Attention):
    """softmax(X W_h (S W_h)ᵀ/√d_k)·S W_h: one matrix W_h = W_Q[h] = W_K[h] = W_V[h] (seed 003).

    Symmetric scores as in ``tied_qk`` and keys equal to values as in ``tied_kv``.
    """

    segments = ("qkv",)


@register("uniform")
class UniformAttention(Attention):
    """mean_{j visible to i} S_j W_V[h] per head h, then W_O: fixed uniform scores, no Q or K.

    The study's control for "is attention used": softmax of constant scores weights every key
    a query may see (mask, causality, padding) by 1/n, so the layer returns the mean of the
    visible values, a bag of the context. Queries and keys are zero tensors (the per-head view
    has W_Q = W_K = 0, b_Q = b_K = 0), so the shared forward, masks, KV cache and cross role run
    unchanged; only W_V and W_O are parameters.

    Why uniform scores and not a zero output: what every compared design has and this one
    lacks is exactly content-based selection (scores from Q·K), while it keeps what they share
    around it: the value and output maps, the residual, the MLPs and a context mean. A zero
    output would also remove the context itself: a decoder becomes a bigram model, and an
    encoder-decoder's decoder would never see the source, so translate would fail for a reason
    that says nothing about selection. A design beating uniform by more than the margin is
    using what its scores pick out; one that does not is not yet, whatever its ties.
    """

    segments = ("v",)

    def queries(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.new_zeros(B, self.cfg.n_heads, T, self.cfg.d_head)  # (B, H, Tq, dk)

    def project(self, x: Tensor, source: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        k, v = self.project_source(x if source is None else source)
        return self.queries(x), k, v

    def project_source(self, source: Tensor) -> tuple[Tensor, Tensor]:
        v = self._heads(self._linear(source), "v")  # (B, G, Tk, dv)
        B, G, Tk, _ = v.shape
        return v.new_zeros(B, G, Tk, self.cfg.d_head), v  # keys (B, G, Tk, dk): all zero
