"""The shared multi-head attention module that every design specializes.

A design is declared by the *segments* of its fused input projection: each segment is one
weight block, and the roles q, k, v read the segment whose name contains them. ``standard``
has segments ("q", "k", "v"); ``tied_qk`` has ("qk", "v"), so W_Q and W_K are one parameter
block used twice. All segments live in one weight ``W_in`` so that self-attention computes
every distinct projection in one GEMM (nanoGPT's ``c_attn``).

Shapes: x (B, Tq, D), source (B, Tk, D); heads q (B, H, Tq, dk), k (B, G, Tk, dk),
v (B, G, Tk, dv). Per-head views (GQA expanded): W_Q, W_K, W_V (H, D, dk|dv), W_O (H, dv, D).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor, nn

from qkvlab.attention.circuits import Circuits
from qkvlab.attention.config import AttentionConfig
from qkvlab.attention.core import KVCache, attend, build_mask, repeat_kv
from qkvlab.attention.view import LayerView
from qkvlab.kernels import Linear, linear
from qkvlab.kernels import attend as decode_kernels

# (x (B, n, T, d), position of x[..., 0, :]) -> rotated x. A K=V layer decoding on the kernel
# also reads its tables ``cos``, ``sin`` (n_ctx, d; rotate-half layout), as models.Rotary has.
Rope = Callable[[Tensor, int], Tensor]


class Attention(Circuits, nn.Module):
    """Multi-head attention; subclasses declare ``segments`` (and may add a value mixing)."""

    segments: tuple[str, ...] = ("q", "k", "v")
    default_scale: str = "inside"

    # ---- declaration -------------------------------------------------------------------
    @classmethod
    @functools.cache  # per class and role: called on every forward (decoding: every token)
    def segment_of(cls, role: str) -> str | None:
        """The segment that serves ``role``; None for a role the design does not compute."""
        return next((s for s in cls.segments if role in s), None)

    @classmethod
    def tied(cls, a: str, b: str) -> bool:
        """Whether roles ``a`` and ``b`` read one weight block (a role without one ties none)."""
        sa = cls.segment_of(a)
        return sa is not None and sa == cls.segment_of(b)

    @classmethod
    def check_config(cls, cfg: AttentionConfig) -> None:
        """Reject option combinations this design cannot take (``ValueError`` naming the field)."""
        name = cfg.design
        if cls.tied("q", "k"):
            if cfg.n_kv_heads != cfg.n_heads:
                raise ValueError(
                    f"n_kv_heads: design {name!r} ties K to Q, so n_kv_heads must equal "
                    f"n_heads={cfg.n_heads} (got {cfg.n_kv_heads})")
        elif cfg.self_mask:
            raise ValueError(f"self_mask: only designs with Q = K take it, not {name!r}")
        if cfg.mix_init != "random" and cls.mix is Attention.mix:
            raise ValueError(f"mix_init: design {name!r} has no mixing matrix to initialize "
                             f"(only designs with one, e.g. 'alt', take {cfg.mix_init!r})")
        if cls.tied("k", "v") and cfg.d_v != cfg.d_head:
            raise ValueError(
                f"d_v: design {name!r} ties K and V, so d_v must equal d_head={cfg.d_head} "
                f"(got {cfg.d_v})")

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        D, H, G, dk, dv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_v
        self._shape: dict[str, tuple[int, int]] = {}  # segment -> (n heads, width per head)
        for s in self.segments:
            self._shape[s] = (H if "q" in s else G, dv if s == "v" else dk)
        self._slices: dict[str, slice] = {}
        start = 0
        for s in self.segments:
            n, d = self._shape[s]
            self._slices[s] = slice(start, start + n * d)
            start += n * d
        self._sizes = [n * d for n, d in self._shape.values()]  # rows of each segment in W_in
        self.W_in = nn.Parameter(torch.empty(start, D))
        self.b_in = nn.Parameter(torch.zeros(start)) if cfg.bias else None
        self.out_proj = Linear(H * dv, D, bias=cfg.bias)
        # Segments a source sequence needs (k, v): contiguous by construction of ``segments``.
        src = [self._slices[s] for s in map(self.segment_of, ("k", "v")) if s is not None]
        self._src_span = slice(min(s.start for s in src), max(s.stop for s in src))
        self.kv_shared = self.tied("k", "v")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.W_in, std=self.cfg.d_model ** -0.5)
        if self.b_in is not None:
            nn.init.zeros_(self.b_in)
        self.out_proj.reset_parameters()

    # ---- projections -------------------------------------------------------------------
    def _heads(self, y: Tensor, seg: str, offset: int = 0) -> Tensor:
        """(B, T, *) slice of a fused projection -> (B, n, T, d) for one segment."""
        n, d = self._shape[seg]
        sl = self._slices[seg]
        B, T, _ = y.shape
        return y[..., sl.start - offset: sl.stop - offset].view(B, T, n, d).transpose(1, 2)

    def _linear(self, x: Tensor, sl: slice | None = None) -> Tensor:
        """x @ W_in[sl]ᵀ (+ b_in[sl]); ``sl=None`` uses the whole W_in without slicing it (a
        slice's backward allocates a zero gradient of W_in's size and copies into it)."""
        if sl is None:
            return linear(x, self.W_in, self.b_in)
        b = None if self.b_in is None else self.b_in[sl]
        return linear(x, self.W_in[sl], b)

    def _split_heads(self, y: Tensor) -> dict[str, Tensor]:
        """A fused projection of every segment (B, T, rows) -> {segment: (B, n, T, d)}: one
        ``split`` (backward: one ``cat``) instead of a slice per role (backward: a zero-filled
        copy of y per role)."""
        B, T, _ = y.shape
        parts = y.split_with_sizes(self._sizes, dim=-1)  # Tensor.split adds a Python layer
        return {s: p.view(B, T, n, d).transpose(1, 2)
                for (s, (n, d)), p in zip(self._shape.items(), parts)}

    def project(self, x: Tensor, source: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from ``x``; keys and values from ``source`` (default: ``x``).

        Tied roles are views of the same projected block (equal values, one GEMM). They are
        deliberately not one tensor object: making ``k is v`` changes the order in which autograd
        sums the tied gradient, so trained tied_qkv models would differ at float precision from
        every stored result.
        """
        sq, sk, sv = (self.segment_of(r) for r in ("q", "k", "v"))
        if source is None:
            y = self._linear(x)  # one GEMM for all segments
            if len(self.segments) == 3:  # one segment per role
                h = self._split_heads(y)
                return h[sq], h[sk], h[sv]
            # Tied roles keep a slice each: a split changes the order in which autograd sums
            # the tied gradient (measured: tied_qkv and rotary tied_kv then differ in the
            # last bits from the stored runs).
            return self._heads(y, sq), self._heads(y, sk), self._heads(y, sv)
        k, v = self.project_source(source)
        return self.queries(x), k, v

    def queries(self, x: Tensor) -> Tensor:
        """Queries of ``x`` alone (B, H, Tq, dk): cross-attention, or a frozen cache."""
        sq = self.segment_of("q")
        return self._heads(self._linear(x, self._slices[sq]), sq, self._slices[sq].start)

    def project_source(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a source sequence, one GEMM."""
        span = self._src_span
        y = self._linear(source, span)
        return (self._heads(y, self.segment_of("k"), span.start),
                self._heads(y, self.segment_of("v"), span.start))

    def mix(self, z: Tensor) -> Tensor:
        """Per-head linear map applied after attention, (B, H, Tq, dv); identity by default."""
        return z

    # ---- forward -----------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        source: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        rope: Rope | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` (B, Tq, D) to ``source`` (B, Tk, D; default ``x``).

        Args:
            attn_mask: bool (True = attend) or additive float, shape (Tq, Tk), (B, Tq, Tk),
                (B, 1, Tq, Tk) or (B, H, Tq, Tk), over all keys including cached ones.
            key_padding_mask: bool (B, Tk), True for real tokens.
            is_causal: query i (at position cache length + i) sees keys at positions <= its own.
            cache: a ``KVCache`` from :meth:`new_cache`; new keys/values are appended, or a
                frozen cache (cross-attention) is filled once and then reused.
            rope: rotary embedding applied to queries and keys at their absolute positions.
            need_weights: also return the attention weights (B, H, Tq, Tk).

        ``self_mask`` (Q = K designs) applies to self-attention only.

        Returns:
            (B, Tq, D), or ``(output, weights)`` with ``need_weights``.
        """
        cfg = self.cfg
        if x.dim() != 3 or x.shape[-1] != cfg.d_model:
            raise ValueError(f"x: shape {tuple(x.shape)} must be (B, T, d_model={cfg.d_model})")
        if source is not None and (source.dim() != 3 or source.shape[-1] != cfg.d_model
                                   or source.shape[0] != x.shape[0]):
            raise ValueError(f"source: shape {tuple(source.shape)} must be (B={x.shape[0]}, Tk, "
                             f"d_model={cfg.d_model})")
        B, Tq, _ = x.shape
        offset = cache.length if cache is not None and not cache.frozen else 0
        key_rope = None
        if cache is not None and cache.frozen and cache.length:
            q = self.queries(x)
            k, v = cache.keys(), cache.values()
        else:
            q, k, v = self.project(x, source)
            if rope is not None and not self.kv_shared:
                k = rope(k, offset)  # cache rotated keys
            if cache is not None:
                k, v = cache.update(k, v)
            if rope is not None and self.kv_shared:
                # keys are the values: cached unrotated, rotated on read; a decode step on
                # the kernel rotates each block as it reads it (the cache read once, not twice)
                if Tq == 1 and decode_kernels.is_active():
                    key_rope = rope.cos, rope.sin
                else:
                    k = rope(k, 0)
        if rope is not None:
            q = rope(q, offset)
        mask, causal = build_mask(
            B=B, H=cfg.n_heads, Tq=Tq, Tk=k.shape[2], q_offset=offset, attn_mask=attn_mask,
            key_padding_mask=key_padding_mask, is_causal=is_causal,
            self_mask=cfg.self_mask and source is None and not (cache is not None and cache.frozen),
            dtype=q.dtype, device=q.device)
        z, weights = attend(q, k, v, mask=mask, is_causal=causal, scale=cfg.inner_scale,
                            dropout_p=cfg.dropout if self.training else 0.0,
                            need_weights=need_weights, key_rope=key_rope)
        z = self.mix(z)
        if cfg.outer_scale != 1.0:
            z = z * cfg.outer_scale
        out = self.out_proj(z.transpose(1, 2).reshape(B, Tq, cfg.n_heads * cfg.d_v))
        return (out, weights) if need_weights else out

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device=None, frozen: bool = False) -> KVCache:
        """An empty KV cache for this layer (one buffer when keys are the values)."""
        cfg = self.cfg
        return KVCache(batch, cfg.n_kv_heads, max_len, cfg.d_head, cfg.d_v, self.kv_shared,
                       dtype or self.W_in.dtype, device or self.W_in.device, frozen=frozen)

    # ---- one view for analysis -----------------------------------------------------------
    def _head_weight(self, role: str) -> Tensor:
        seg = self.segment_of(role)
        if seg is None:  # a role the design does not compute: its projection is zero
            d = self.cfg.d_v if role == "v" else self.cfg.d_head
            return self.W_in.new_zeros(self.cfg.n_heads, self.cfg.d_model, d)
        n, d = self._shape[seg]
        w = self.W_in[self._slices[seg]].view(n, d, self.cfg.d_model).transpose(1, 2)  # (n, D, d)
        return repeat_kv(w, self.cfg.n_heads, dim=0)  # (H, D, d)

    def _head_bias(self, role: str) -> Tensor | None:
        if self.b_in is None:
            return None
        seg = self.segment_of(role)
        if seg is None:
            return self.b_in.new_zeros(self.cfg.n_heads,
                                       self.cfg.d_v if role == "v" else self.cfg.d_head)
        n, d = self._shape[seg]
        b = self.b_in[self._slices[seg]].view(n, d)  # (n, d), n = H or G
        return repeat_kv(b, self.cfg.n_heads, dim=0)  # (H, d)

    @property
    def W_Q(self) -> Tensor:
        """(H, D, dk): q_h = x @ W_Q[h] + b_Q[h]."""
        return self._head_weight("q")

    @property
    def W_K(self) -> Tensor:
        """(H, D, dk), GQA heads expanded."""
        return self._head_weight("k")

    @property
    def W_V(self) -> Tensor:
        """(H, D, dv), GQA heads expanded."""
        return self._head_weight("v")

    @property
    def b_Q(self) -> Tensor | None:
        return self._head_bias("q")

    @property
    def b_K(self) -> Tensor | None:
        return self._head_bias("k")

    @property
    def b_V(self) -> Tensor | None:
        return self._head_bias("v")

    def mix_matrices(self) -> Tensor | None:
        """(H, dv, dv) per-head matrices M_h applied as z_h @ M_h after attention, if any."""
        return None

    @property
    def W_O(self) -> Tensor:
        """(H, dv, D): effective output map of each head, out = Σ_h z_h @ W_O[h] + b_O.

        Includes whatever the design applies between the softmax and W_O (``alt``'s W_hᵀ and
        the outer scale), so analysis sees the function, not the storage.
        """
        cfg = self.cfg
        w = self.out_proj.weight.T.reshape(cfg.n_heads, cfg.d_v, cfg.d_model)
        m = self.mix_matrices()
        if m is not None:
            w = m @ w
        return w * cfg.outer_scale

    @property
    def b_O(self) -> Tensor | None:
        return self.out_proj.bias

    def view(self, layer: int = 0, role: str = "decoder", name: str = "", *,
             grad: bool = False) -> LayerView:
        """This layer as the shared per-head view (``attention.view.LayerView``: float64, GQA
        expanded, W_O the effective output map), the record the analysis and the tests read.
        A detached copy, unless ``grad`` keeps the graph back to this module's parameters."""
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            return LayerView(layer=layer, role=role, name=name, W_Q=self.W_Q, W_K=self.W_K,
                             W_V=self.W_V, W_O=self.W_O, b_Q=self.b_Q, b_K=self.b_K,
                             b_V=self.b_V, b_O=self.b_O, n_kv_heads=self.cfg.n_kv_heads,
                             grad=grad)

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"design={c.design}, d_model={c.d_model}, n_heads={c.n_heads}, "
                f"n_kv_heads={c.n_kv_heads}, d_head={c.d_head}, d_v={c.d_v}, scale={c.scale}, "
                f"segments={self.segments}")

