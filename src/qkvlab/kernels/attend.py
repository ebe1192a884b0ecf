"""Decode attention that reads each cached byte once per step: one query per sequence.

A decoding step attends one new query per sequence to the whole KV cache, so at long context
the step is a read of the cache. PyTorch's CPU SDPA, given the step as it comes (one query per
head, ``enable_gqa`` for GQA), runs each query head on its own: the H/G query heads of a GQA
group each read their kv head again, so GQA and MQA decode barely faster than standard. This
kernel:

* packs the query heads of a group as the query *rows* of their one kv head: q (B, H, 1, d)
  viewed as (B, G, H/G, d) against k, v (B, G, T, d), one SDPA call; its flash kernel walks the
  cache in blocks and serves every row of a block from the CPU's cache, so each cached key and
  value is read from memory once per step whatever the group size (MQA reads its one head once,
  not H times). It is SDPA, so it computes what SDPA does (same softmax, per row), and for a
  group of one head it is the same call;
* a K=V buffer (``tied_kv``/``tied_qkv``) is passed as both k and v: SDPA reads each block as
  keys and then, still cached, as values (measured 1.65x standard's step at 32k x 16 on the
  2-core Xeon, 2026-11-26, where qkvlab's earlier blocked GEMMs read 1.0-1.5x);
* rotary K=V (below) walks the cache in blocks of about ``BLOCK_BYTES`` with batched GEMMs, so
  that a block rotated to serve as keys is still cached when read unrotated as values (an
  online softmax where a block is shorter than a sequence, Milakov & Gimelshein 2018).

Choose and apply it as ``kernels.gemv`` does, around generate's token loop only:

    with use(decode_attention_kernel(layer, batch, context)):   # "blocked" or "sdpa"
        ...  # core.attend sends one-query, unmasked steps to decode_attention
    set_attention_kernel("sdpa")   # pin one for every model ("blocked", or "auto")

("blocked" names this kernel; its packed SDPA needs no blocks of its own.) Training,
evaluation and every forward outside a ``use("blocked")`` block run SDPA unchanged, so stored
runs stay bit-identical. Shapes: q (B, H, 1, dk), k (B, G, T, dk), v (B, G, T, dv).

Rotary K=V (``rope=(cos, sin)``): the cache holds the pre-rotary k, which are the values; the
keys are its rotation to their positions, R_j k_j. With rotary in the rotate-half layout (GPT-NeoX,
HF Llama: R_p x = x·cos_p + rotate_half(x)·sin_p, rotate_half(x) = [−x₂, x₁], R_p orthogonal,
R_pᵀ = R_{−p}, R_iᵀ R_j = R_{j−i}) the score of the query at position i against key j is

    ⟨R_i q, R_j k_j⟩ = qᵀ R_{j−i} k_j = ⟨R_{i−j} q, k_j⟩,

so the query arrives rotated (R_i q) and each block of the cache is rotated to R_j k_j *as it is
read*, into a block-sized buffer that the next product reads from the CPU's cache, while the same
block, unrotated, serves as the values: one read of the cache per step, where rotating the
whole cache first (``Attention.forward`` outside this kernel) reads it twice and writes a copy.
The blocks' products are K·qᵀ, (T, d) by (d, H/G), the layout MKL's batched GEMM reads fastest
(as ``kernels.gemv`` found).

On a CUDA device with Triton importable the step runs ``kernels.triton_decode`` instead (the
same function, split along the context); nothing on the CPU path imports Triton.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from qkvlab.kernels.choice import KernelChoice
from qkvlab.timing import interleaved, seconds

__all__ = ["ATTENTION_KERNELS", "BLOCK_BYTES", "attention_probe", "decode_attention",
           "decode_attention_kernel", "is_active", "rotate", "set_attention_kernel", "use"]

ATTENTION_KERNELS = ("auto", "sdpa", "blocked")
# A block of a rotary K=V buffer is read twice: 8 MB stays in this EPYC's 32 MB L3 between the
# reads beside the other core's block; much smaller blocks pay per-op Python overhead instead.
BLOCK_BYTES = 8 << 20
FASTER_RATIO = 1.1  # "auto" takes the blocked kernel only where it measured this much faster

CHOICE = KernelChoice("attention kernel", ATTENTION_KERNELS, "sdpa")


def shares_storage(k: Tensor, v: Tensor) -> bool:
    """Whether ``k`` and ``v`` are the same memory (a K=V cache read as keys and as values)."""
    return (k.data_ptr() == v.data_ptr() and k.shape == v.shape and k.stride() == v.stride())


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary in the rotate-half layout: x·cos + [−x₂, x₁]·sin, the tables (T, d) broadcast over
    x (..., T, d) (``models.Rotary`` and HF Llama compute the same, in x's dtype)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                     block_bytes: int = BLOCK_BYTES,
                     rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """softmax(scale · q kᵀ) v for one query per sequence, GQA/MQA when k has fewer heads.

    q (B, H, 1, dk), k (B, G, T, dk), v (B, G, T, dv) with G dividing H (query head h reads kv
    head h // (H/G), as SDPA's ``enable_gqa``); returns (B, H, 1, dv). ``k`` and ``v`` may be
    views of the cache (``KVCache.keys()``). Without ``rope`` it is one SDPA call with the
    group's query heads as rows; with it the cache is read in blocks of ``block_bytes`` so
    each block is fetched from memory once.

    ``rope``: (cos, sin) tables of at least T rows (dk columns, rotate-half layout): the keys
    are then ``rotate(k, cos[:T], sin[:T])``, rotated block by block as they are read, and the
    values ``v`` unrotated (a rotary K=V cache: ``v`` is ``k``, the pre-rotary keys). ``q`` is
    already rotated to its own position. On a CUDA device with Triton this runs
    ``kernels.triton_decode.decode_attention``.

    Raises:
        ValueError: more than one query, or G not dividing H.
    """
    if q.device.type == "cuda" and _triton_runs(q, k, v):
        from qkvlab.kernels import triton_decode
        return triton_decode.decode_attention(q, k, v, scale, rope=rope)
    if rope is None:
        return _packed(q, k, v, scale)
    qs, kf, vf, n, tb = _plan(q, k, v, scale, block_bytes)
    B, H, dv, N, r = q.shape[0], q.shape[1], v.shape[-1], kf.shape[0], qs.shape[-1]
    T = k.shape[2]
    cos, sin = rope[0][:T].to(k.dtype), rope[1][:T].to(k.dtype)
    if n is None:  # keys and values are separate reads anyway: one pass
        keys = rotate(kf, cos, sin)
        p = torch.bmm(keys, qs).mT.softmax(dim=-1)  # (N, r, T)
        return torch.bmm(p, vf).view(B, H, 1, dv)
    out = q.new_empty(N, r, dv)
    for i in range(0, N, n):
        j = min(N, i + n)
        if tb is None:  # the block holds whole sequences: plain softmax
            keys = rotate(kf[i:j], cos, sin)  # the block, still cached
            p = torch.bmm(keys, qs[i:j]).mT.softmax(dim=-1)  # (n, r, T)
            torch.bmm(p, vf[i:j], out=out[i:j])
        else:
            out[i:j] = _online(qs[i:j], kf[i:j], tb, cos, sin)
    return out.view(B, H, 1, dv)


def _packed(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """One SDPA call, the H/G query heads of each group as the query rows of its kv head."""
    B, H, Tq, dk = q.shape
    G = k.shape[1]
    if Tq != 1 or H % G:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} must hold one query and G={G} "
                         f"must divide H={H}")
    out = F.scaled_dot_product_attention(q.reshape(B, G, H // G, dk), k, v, scale=scale)
    return out.reshape(B, H, 1, v.shape[-1])


def _triton_runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the Triton kernel takes this CUDA step: Triton imports and the dtype is one it
    computes (float16, bfloat16, float32)."""
    from qkvlab.kernels import triton_decode
    return triton_decode.available() and triton_decode.supports(q, k, v)


def _plan(q: Tensor, k: Tensor, v: Tensor, scale: float, block_bytes: int):
    """The rotary path's operands and blocks: stacked scaled queries (N, dk, r), the cache as
    (N, T, d) views, sequences per block ``n`` (None: k and v are separate, one pass) and
    tokens per block ``tb`` (None: whole sequences, else the online softmax). A block's rotated
    copy sits beside it in the CPU's cache: half of ``block_bytes`` each."""
    B, H, Tq, dk = q.shape
    G, T = k.shape[1], k.shape[2]
    if Tq != 1 or H % G:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} must hold one query and G={G} "
                         f"must divide H={H}")
    qs = (q.reshape(B * G, H // G, dk) * scale).mT  # (N, dk, r): heads of a group stacked
    kf, vf = k.flatten(0, 1), v.flatten(0, 1)  # (N, T, dk|dv), views of the cache
    if not shares_storage(k, v):
        return qs, kf, vf, None, None
    block_bytes //= 2
    per_seq = T * dk * k.element_size()
    n = max(1, block_bytes // per_seq)  # sequences (b, g) per block
    if n > 1 or per_seq <= block_bytes:
        return qs, kf, vf, n, None
    return qs, kf, vf, n, max(1, block_bytes // (dk * k.element_size()))


def _online(qs: Tensor, kv: Tensor, tb: int, cos: Tensor | None = None,
            sin: Tensor | None = None) -> Tensor:
    """One K=V sequence block (n, T, d) in token blocks of ``tb`` with an online softmax:
    running max m, normalizer norm and unnormalized output acc, rescaled as the max grows.
    With rotary tables (T, d) each token block is rotated as it is read to serve as keys."""
    n, T, d = kv.shape
    m = norm = acc = None
    for t in range(0, T, tb):
        blk = kv[:, t:t + tb]  # (n, tb, d): read as keys, then (in cache) as values
        keys = blk if cos is None else rotate(blk, cos[t:t + tb], sin[t:t + tb])
        s = torch.bmm(keys, qs).mT  # (n, r, tb)
        m_blk = s.amax(dim=-1, keepdim=True)
        if m is None:
            m = m_blk
            p = (s - m).exp_()
            norm, acc = p.sum(dim=-1, keepdim=True), torch.bmm(p, blk)
            continue
        m_new = torch.maximum(m, m_blk)
        c = (m - m_new).exp_()
        p = (s - m_new).exp_()
        norm = norm * c + p.sum(dim=-1, keepdim=True)
        acc = acc * c + torch.bmm(p, blk)
        m = m_new
    return acc / norm


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def attention_probe(batch: int, n_heads: int, n_kv_heads: int, context: int, d_head: int,
                    shared: bool, reps: int = 3, device="cpu", rotary: bool = False) -> float:
    """Measured time(SDPA) / time(:func:`decode_attention`) of one decode step's attention at
    these sizes (fp32, random cache, a shared K=V buffer where ``shared``); > 1: the blocked
    kernel is faster. Alternating after a warm-up, median of ``reps``. ``rotary`` (with
    ``shared``): the cache holds pre-rotary keys, so SDPA's step is the rotation of the whole
    cache and then SDPA (``Attention.forward``'s path), the kernel's the rotation per block."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(batch, n_heads, 1, d_head, generator=g).to(device)
    k = torch.empty(batch, n_kv_heads, context, d_head, device=device).uniform_(-1, 1)
    v = k if shared else torch.empty_like(k).uniform_(-1, 1)
    s = d_head ** -0.5
    rope = None
    if rotary and shared:
        ang = torch.rand(context, d_head, generator=g).to(device)
        rope = ang.cos(), ang.sin()

    def sdpa():
        return _sdpa(q, k if rope is None else rotate(k, *rope), v, s)

    def blocked():
        return decode_attention(q, k, v, s, rope=rope)

    with torch.no_grad():
        t = interleaved({"sdpa": lambda: seconds(sdpa, device=device),
                         "blocked": lambda: seconds(blocked, device=device)}, reps)
    return t["sdpa"] / max(t["blocked"], 1e-9)


def decode_attention_kernel(layer, batch: int, context: int, rotary: bool = False) -> str:
    """The kernel the decode steps of attention ``layer`` should run at ``batch`` sequences of
    up to ``context`` tokens: ``"blocked"`` or ``"sdpa"``. ``rotary``: the model rotates keys
    (it matters where K=V: such a cache holds pre-rotary keys).

    The pinned one (:func:`set_attention_kernel`), else on the CPU measured by
    :func:`attention_probe` at the layer's sizes and the context rounded down to a power of two
    (the blocked kernel's gain grows with context: rounded up, at 513 tokens the probe measured
    1,024 and chose a kernel that ran the step 5% slower than SDPA), kept on the layer per
    (thread count, batch, rounded context, rotary); not fp32 on the CPU, or one query head
    per kv head without rotary K=V (where the kernel is the same SDPA call): ``"sdpa"``
    (not measured). On a CUDA device ``"blocked"`` (the Triton kernel) where Triton
    imports and the dtype is one it computes, else ``"sdpa"``: not measured against SDPA, no
    GPU was at hand when it was written.
    """
    if CHOICE.pinned is not None:
        return CHOICE.pinned
    cfg, w = layer.cfg, layer.W_in
    if w.device.type == "cuda":
        from qkvlab.kernels import triton_decode
        return "blocked" if triton_decode.available() and w.dtype in triton_decode.DTYPES \
            else "sdpa"
    if w.dtype != torch.float32 or w.device.type != "cpu":
        return "sdpa"
    rotary = rotary and layer.kv_shared
    if not rotary and cfg.n_kv_heads == cfg.n_heads:
        return "sdpa"  # one head per group: the kernel is this same SDPA call
    ctx = 1 << max(1, context).bit_length() - 1  # rounded down: blocked gains with context
    key = (torch.get_num_threads(), batch, ctx) + (("rotary",) if rotary else ())
    chosen = layer.__dict__.setdefault("_attention_kernel", {})
    if key not in chosen:
        ratio = attention_probe(batch, cfg.n_heads, cfg.n_kv_heads, ctx, cfg.d_head,
                                layer.kv_shared, rotary=rotary)
        chosen[key] = "blocked" if ratio >= FASTER_RATIO else "sdpa"
    return chosen[key]


def set_attention_kernel(kind: str) -> None:
    """Pin the decode attention of every model: ``"sdpa"``, ``"blocked"``, or ``"auto"`` (the
    default: measured per layer, batch and context by :func:`decode_attention_kernel`).

    Raises:
        ValueError: ``kind`` is not one of ``ATTENTION_KERNELS``.
    """
    CHOICE.pin(kind)


def use(kind: str) -> contextlib.AbstractContextManager[None]:
    """One-query, unmasked attention steps inside the block run on ``kind``."""
    return CHOICE.use(kind)


def is_active() -> bool:
    """Whether the current ``use`` block runs the blocked kernel."""
    return CHOICE.active == "blocked"
