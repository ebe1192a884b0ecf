"""The kernel every design shares: mask building, fused SDPA, and the KV cache.

Shapes: q (B, H, Tq, dk), k (B, G, Tk, dk), v (B, G, Tk, dv), output (B, H, Tq, dv).
Masks follow SDPA's convention: a boolean ``True`` means "may attend"; a float mask is added
to the scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from qkvlab.kernels import attend as decode_kernels


def repeat_kv(t: Tensor, n_heads: int, dim: int) -> Tensor:
    """Expand G key/value heads to ``n_heads`` query heads along ``dim`` (GQA, MQA at G = 1).

    ``t`` has G = ``t.shape[dim]`` heads there, e.g. k (B, G, Tk, dk) with ``dim=1`` or a
    per-head weight (G, D, dk) with ``dim=0``; the result has ``n_heads`` there, other sizes
    unchanged. Returns ``t`` itself when G = ``n_heads``.

    Query head h reads kv head h // (n_heads // G): the H/G query heads of one group are
    contiguous, as in SDPA's ``enable_gqa`` and HF's ``repeat_kv``. That is
    ``repeat_interleave`` (0 0 1 1), not ``repeat``/``expand`` of the whole block (0 1 0 1),
    which would pair query heads with the wrong keys.

    Raises:
        ValueError: if G does not divide ``n_heads``.
    """
    G = t.shape[dim]
    if G == n_heads:
        return t
    if n_heads % G:
        raise ValueError(f"n_kv_heads: {G} does not divide n_heads={n_heads}")
    return t.repeat_interleave(n_heads // G, dim=dim)


def check_mask(attn_mask: Tensor, B: int, H: int, Tq: int, Tk: int) -> Tensor:
    """Validate a user mask and return it as (B|1, H|1, Tq, Tk).

    Accepted shapes: (Tq, Tk), (B, Tq, Tk), (B, 1, Tq, Tk) or (B, H, Tq, Tk); dtype bool
    (True = attend) or floating (added to the scores). Anything else raises ``ValueError``
    rather than broadcasting silently.
    """
    if not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        raise ValueError(f"attn_mask: dtype {attn_mask.dtype} must be torch.bool or floating")
    allowed = [(Tq, Tk), (B, Tq, Tk), (B, 1, Tq, Tk), (B, H, Tq, Tk)]
    if tuple(attn_mask.shape) not in allowed:
        raise ValueError(
            f"attn_mask: shape {tuple(attn_mask.shape)} is not one of {allowed} "
            "(Tq, Tk), (B, Tq, Tk), (B, 1, Tq, Tk) or (B, H, Tq, Tk)"
        )
    if attn_mask.dim() == 2:
        return attn_mask[None, None]
    if attn_mask.dim() == 3:
        return attn_mask[:, None]
    return attn_mask


def check_key_padding_mask(mask: Tensor, B: int, Tk: int) -> Tensor:
    """Validate a (B, Tk) boolean key-padding mask (True = real token) and return (B, 1, 1, Tk)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask: dtype {mask.dtype} must be torch.bool (True = keep)")
    if tuple(mask.shape) != (B, Tk):
        raise ValueError(f"key_padding_mask: shape {tuple(mask.shape)} must be (B, Tk) = {(B, Tk)}")
    if not bool(mask.any(dim=-1).all()):
        raise ValueError("key_padding_mask: a batch element has no key left to attend to")
    return mask[:, None, None, :]


def build_mask(
    *,
    B: int,
    H: int,
    Tq: int,
    Tk: int,
    q_offset: int,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    self_mask: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor | None, bool]:
    """Combine every mask into one SDPA mask.

    Query i sits at absolute position ``q_offset + i`` (``q_offset`` = tokens already in the
    KV cache), key j at position j. Returns ``(mask, use_is_causal)``; the plain causal case
    with no cache is left to SDPA's ``is_causal`` fast path.
    """
    if is_causal and Tq != Tk - q_offset:
        raise ValueError(f"is_causal: queries ({Tq}) must be the last tokens of the keys ({Tk})")
    plain_causal = is_causal and attn_mask is None and key_padding_mask is None and not self_mask
    if plain_causal and q_offset == 0:
        return None, True
    if plain_causal and Tq == 1:  # one new token during decoding sees every cached key
        return None, False
    if not (attn_mask is not None or key_padding_mask is not None or is_causal or self_mask):
        return None, False

    allowed: Tensor | None = None  # boolean part
    if is_causal:
        qpos = torch.arange(Tq, device=device)[:, None] + q_offset
        allowed = torch.arange(Tk, device=device)[None, :] <= qpos
        allowed = allowed[None, None]
    if key_padding_mask is not None:
        kpm = check_key_padding_mask(key_padding_mask, B, Tk)
        allowed = kpm if allowed is None else allowed & kpm
    additive: Tensor | None = None
    if attn_mask is not None:
        m = check_mask(attn_mask, B, H, Tq, Tk)
        if m.dtype == torch.bool:
            allowed = m if allowed is None else allowed & m
        else:
            additive = m.to(dtype)
    if self_mask:
        # Reformer: a large finite penalty (not -inf) so a query with no other target
        # still attends to itself instead of producing NaN.
        qpos = torch.arange(Tq, device=device)[:, None] + q_offset
        diag = torch.arange(Tk, device=device)[None, :] == qpos
        penalty = torch.zeros(Tq, Tk, dtype=dtype, device=device)
        penalty.masked_fill_(diag, torch.finfo(dtype).min / 2)
        additive = penalty[None, None] if additive is None else additive + penalty
    if additive is None:
        return allowed, False
    if allowed is not None:
        additive = additive.masked_fill(~allowed, float("-inf"))
    return additive, False


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    key_rope: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(scale * q kᵀ + mask) v with fused SDPA; GQA when k, v have fewer heads.

    With ``need_weights`` the same result is computed explicitly so the attention weights
    (B, H, Tq, Tk) can be returned; the default path never materializes them. Inside
    ``kernels.attend.use("blocked")`` (generate's token loop, where measured faster) a step of
    one query with no mask runs ``kernels.attend.decode_attention`` instead of SDPA.
    ``key_rope`` (cos, sin) tables: the keys are ``k`` rotated to positions 0..Tk-1 (a rotary
    K=V cache of pre-rotary keys); the kernel rotates them block by block as it reads them.
    """
    H, G = q.shape[1], k.shape[1]
    if (decode_kernels.is_active() and q.shape[2] == 1 and mask is None and not is_causal
            and not need_weights and not dropout_p):
        return decode_kernels.decode_attention(q, k, v, scale, rope=key_rope), None
    if key_rope is not None:
        Tk = k.shape[2]
        k = decode_kernels.rotate(k, key_rope[0][:Tk].to(k.dtype), key_rope[1][:Tk].to(k.dtype))
    if not need_weights:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=G != H,
        )
        return out, None
    k, v = repeat_kv(k, H, dim=1), repeat_kv(v, H, dim=1)  # (B, H, Tk, dk|dv), as enable_gqa
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    if is_causal:
        Tq, Tk = scores.shape[-2:]
        future = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if mask is not None:
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask)
    weights = scores.softmax(dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


class KVCache:
    """Keys and values of one attention layer, preallocated for incremental decoding.

    When a design's keys *are* its values (``tied_kv``, ``tied_qkv``), one buffer holds both,
    halving the cache. ``frozen`` caches (cross-attention) are filled once from the source
    sequence and then only read.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, d_head: int, d_v: int,
                 shared: bool, dtype: torch.dtype, device: torch.device | str = "cpu",
                 frozen: bool = False):
        if shared and d_head != d_v:
            raise ValueError("KVCache: a shared key/value buffer needs d_head == d_v")
        self.max_len, self.shared, self.frozen, self.length = max_len, shared, frozen, 0
        self.k = torch.empty(batch, n_kv_heads, max_len, d_head, dtype=dtype, device=device)
        self.v = self.k if shared else torch.empty(
            batch, n_kv_heads, max_len, d_v, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers (a shared buffer counts once)."""
        n = self.k.numel() * self.k.element_size()
        return n if self.shared else n + self.v.numel() * self.v.element_size()

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, G, T, d) keys/values; return everything cached so far."""
        if self.frozen and self.length:
            raise RuntimeError("KVCache: a frozen cache is written once")
        T = k.shape[2]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KVCache: {end} tokens exceed the cache length {self.max_len}")
        # narrow + copy_ rather than indexing with slices: the same writes, but a tuple index
        # costs microseconds of Python per call, four calls per layer per decoded token
        self.k.narrow(2, self.length, T).copy_(k)
        if not self.shared:
            self.v.narrow(2, self.length, T).copy_(v)
        self.length = end
        return self.keys(), self.values()

    def keys(self) -> Tensor:
        return self.k.narrow(2, 0, self.length)

    def values(self) -> Tensor:
        return self.v.narrow(2, 0, self.length)
