"""Decode attention that reads each cached byte once per step: one query per sequence.

A decoding step attends one new query per sequence to the whole KV cache, so at long context
the step is a read of the cache. PyTorch's CPU SDPA, given the step as it comes (one query per
head, ``enable_gqa`` for GQA), runs each query head on its own: the H/G query heads of a GQA
group each read their kv head again, so GQA and MQA decode barely faster than standard. And
even for one head it reads the cache at about half the bandwidth one thread reaches. This
kernel ("blocked", the name it has kept), by device and dtype:

* float32 on the CPU, ``kernels.numba_decode``: each row (sequence, kv head) walked once,
  token by token; the key row scored against every query head of its group, the value row (for
  K=V the same bytes, still in L1) added under an online softmax (Milakov & Gimelshein 2018),
  a rotary K=V cache's keys rotated as each row is loaded. Compiled by Numba on first use;
* on a CUDA device with Triton, ``kernels.triton_decode`` (FlashDecoding, split along the
  context); nothing on the CPU path imports Triton;
* otherwise the query heads of a group packed as the query *rows* of one SDPA call against
  their kv head, q (B, H, 1, d) viewed as (B, G, H/G, d) (each cached byte read once per step
  by SDPA's flash kernel; a K=V buffer passed as both k and v), and for rotary K=V the eager
  blocks: the cache walked in token blocks of about ``BLOCK_BYTES`` across every sequence,
  each block rotated into a reused buffer for its scores and read unrotated as the values.

Choose and apply it as ``kernels.gemv`` does, around generate's token loop only:

    with use(decode_attention_kernel(layer, batch, context)):   # "blocked" or "sdpa"
        ...  # core.attend sends one-query, unmasked steps to decode_attention
    set_attention_kernel("sdpa")   # pin one for every model ("blocked", or "auto")

Training, evaluation and every forward outside a ``use("blocked")`` block run SDPA unchanged,
so stored runs stay bit-identical. Shapes: q (B, H, 1, dk), k (B, G, T, dk), v (B, G, T, dv).

Rotary K=V (``rope=(cos, sin)``): the cache holds the pre-rotary k, which are the values; the
keys are its rotation to their positions, R_j k_j. With rotary in the rotate-half layout (GPT-NeoX,
HF Llama: R_p x = x·cos_p + rotate_half(x)·sin_p, rotate_half(x) = [−x₂, x₁], R_p orthogonal,
R_pᵀ = R_{−p}, R_iᵀ R_j = R_{j−i}) the score of the query at position i against key j is

    ⟨R_i q, R_j k_j⟩ = qᵀ R_{j−i} k_j = ⟨R_{i−j} q, k_j⟩,

so the query arrives rotated (R_i q) and each key is rotated to R_j k_j *as it is read*, while
the same bytes, unrotated, serve as the values: one read of the cache per step, where rotating
the whole cache first (``Attention.forward`` outside this kernel) reads it twice and writes a
copy. Eager PyTorch cannot fuse that elementwise rotation into the product (its blocks ran
rotary K=V at 0.26-0.33x rotary standard's step at 32k x 16 on the 2-core Xeon); the Numba
kernel does it in registers (DEVELOPERS.md, "Decode attention").
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from qkvlab.kernels.choice import KernelChoice
from qkvlab.timing import interleaved, seconds

__all__ = ["ATTENTION_KERNELS", "BLOCK_BYTES", "attention_probe", "decode_attention",
           "decode_attention_kernel", "is_active", "rotate", "set_attention_kernel", "use"]

ATTENTION_KERNELS = ("auto", "sdpa", "blocked")
# Rotary K=V's token blocks across all sequences: 4 MB ran 32k x 16 fastest of 1, 4 and 16 MB
# on the 2-core Xeon (2026-11-26); smaller blocks pay per-op Python overhead instead.
BLOCK_BYTES = 4 << 20
FASTER_RATIO = 1.1  # "auto" takes the blocked kernel only where it measured this much faster
PROBE_SECONDS, PROBE_MAX_REPS = 0.2, 25  # the probe's rounds: about this long, at most this many

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
    views of the cache (``KVCache.keys()``). Float32 on the CPU it runs
    ``kernels.numba_decode`` (each cached row read once, for every query head of its group;
    Numba compiles it on first use); on a CUDA device with Triton,
    ``kernels.triton_decode.decode_attention``; otherwise, without ``rope``, one SDPA call with
    the group's query heads as rows, and with it the eager blocks (the cache read in token
    blocks of about ``block_bytes`` across every sequence).

    ``rope``: (cos, sin) tables of at least T rows (dk columns, rotate-half layout): the keys
    are then ``rotate(k, cos[:T], sin[:T])``, rotated as they are read, and the values ``v``
    unrotated (a rotary K=V cache: ``v`` is ``k``, the pre-rotary keys). ``q`` is already
    rotated to its own position.

    Raises:
        ValueError: more than one query, or G not dividing H.
    """
    if q.device.type == "cuda" and _triton_runs(q, k, v):
        from qkvlab.kernels import triton_decode
        return triton_decode.decode_attention(q, k, v, scale, rope=rope)
    _check(q, k)
    if _fused_runs(q, k, v):
        from qkvlab.kernels import numba_decode
        return numba_decode.decode(q, k, v, scale, rope)
    if rope is None:
        return _packed(q, k, v, scale)
    return _rotary_blocks(q, k, v, scale, rope, block_bytes)


def _fused_runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the step runs ``kernels.numba_decode`` (one pass over the cache, any rotation
    fused into the score): float32 CPU tensors, each row of the cache contiguous, and Numba
    importable."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1
               for t in (q, k, v)):
        return False
    return _numba_imports()


@functools.cache
def _numba_imports() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _check(q: Tensor, k: Tensor) -> None:
    """One query per sequence, and G kv heads dividing H query heads."""
    H, Tq, G = q.shape[1], q.shape[2], k.shape[1]
    if Tq != 1 or H % G:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} must hold one query and G={G} "
                         f"must divide H={H}")


def _packed(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """One SDPA call, the H/G query heads of each group as the query rows of its kv head."""
    B, H, _, dk = q.shape
    G = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(B, G, H // G, dk), k, v, scale=scale)
    return out.reshape(B, H, 1, v.shape[-1])


def _triton_runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the Triton kernel takes this CUDA step: Triton imports and the dtype is one it
    computes (float16, bfloat16, float32)."""
    from qkvlab.kernels import triton_decode
    return triton_decode.available() and triton_decode.supports(q, k, v)


def _rotary_blocks(q: Tensor, k: Tensor, v: Tensor, scale: float,
                   rope: tuple[Tensor, Tensor], block_bytes: int) -> Tensor:
    """Eager PyTorch, any dtype and device: the cache walked in token blocks across every
    sequence at once (B·G rows × ``tb`` tokens, about ``block_bytes``), so one slice of the
    rope tables serves every row and stays in L1; each block is rotated into one reused
    buffer by four in-place products on its halves (the rotate-half tables repeat their
    halves, as ``models.Rotary`` and HF Llama build them: half of each is read), its scores
    taken with a batched GEMM (K·qᵀ), and the same block, unrotated, weighs the values; an
    online softmax across blocks (Milakov & Gimelshein 2018)."""
    B, H, _, dk = q.shape
    G, T, dv = k.shape[1], k.shape[2], v.shape[-1]
    N, h = B * G, dk // 2
    qs = (q.reshape(N, H // G, dk) * scale).mT  # (N, dk, r): heads of a group stacked
    kf, vf = k.flatten(0, 1), v.flatten(0, 1)  # (N, T, d), views of the cache
    cos, sin = rope[0][:T, :h].to(k.dtype), rope[1][:T, :h].to(k.dtype)
    tb = max(1, block_bytes // (N * dk * k.element_size()))
    buf = kf.new_empty(N, min(tb, T), dk)
    m = norm = acc = None
    for t in range(0, T, tb):
        blk = kf[:, t:t + tb]  # (N, n, d): read once, as keys and (K = V) as values
        n = blk.shape[1]
        keys, k1, k2 = buf[:, :n], blk[..., :h], blk[..., h:]
        c, si = cos[t:t + n], sin[t:t + n]
        torch.mul(k1, c, out=keys[..., :h]).addcmul_(k2, si, value=-1)  # R_j k_j, first half
        torch.mul(k2, c, out=keys[..., h:]).addcmul_(k1, si)
        sc = torch.bmm(keys, qs).mT  # (N, r, n)
        m_blk = sc.amax(dim=-1, keepdim=True)
        vals = vf[:, t:t + tb]
        if m is None:
            m = m_blk
            p = (sc - m).exp_()
            norm, acc = p.sum(dim=-1, keepdim=True), torch.bmm(p, vals)
            continue
        m_new = torch.maximum(m, m_blk)
        c_old = (m - m_new).exp_()
        p = (sc - m_new).exp_()
        norm = norm * c_old + p.sum(dim=-1, keepdim=True)
        acc = acc * c_old + torch.bmm(p, vals)
        m = m_new
    return (acc / norm).view(B, H, 1, dv)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def attention_probe(batch: int, n_heads: int, n_kv_heads: int, context: int, d_head: int,
                    shared: bool, reps: int | None = None, device="cpu",
                    rotary: bool = False, dtype: torch.dtype = torch.float32) -> float:
    """Measured time(SDPA) / time(:func:`decode_attention`) of one decode step's attention at
    these sizes (random cache in ``dtype``, a shared K=V buffer where ``shared``); > 1: the
    blocked kernel is faster (on a CUDA device, the Triton kernel). Alternating after a
    warm-up, median of ``reps`` rounds; ``None``: as many as fit in about ``PROBE_SECONDS`` (3
    to ``PROBE_MAX_REPS``), so short steps, whose single rounds spread most, get many rounds and
    long ones few (three rounds misread a 512 x 16 step at two threads, choosing a kernel that
    ran it at 0.67x SDPA; 2026-11-28). ``rotary``
    (with ``shared``): the cache holds pre-rotary keys, so SDPA's step is the rotation of the
    whole cache and then SDPA (``Attention.forward``'s path), the kernel's the rotation as it
    reads."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(batch, n_heads, 1, d_head, generator=g).to(device, dtype)
    k = torch.empty(batch, n_kv_heads, context, d_head, device=device, dtype=dtype).uniform_(-1, 1)
    v = k if shared else torch.empty_like(k).uniform_(-1, 1)
    s = d_head ** -0.5
    rope = None
    if rotary and shared:
        ang = torch.rand(context, d_head, generator=g).to(device, dtype)
        rope = ang.cos(), ang.sin()

    def sdpa():
        return _sdpa(q, k if rope is None else rotate(k, *rope), v, s)

    def blocked():
        return decode_attention(q, k, v, s, rope=rope)

    with torch.no_grad():
        if reps is None:  # each once untimed (a first call may compile), then once timed
            sdpa(), blocked()
            once = seconds(sdpa, device=device) + seconds(blocked, device=device)
            reps = int(min(PROBE_MAX_REPS, max(3, PROBE_SECONDS // max(once, 1e-9))))
        t = interleaved({"sdpa": lambda: seconds(sdpa, device=device),
                         "blocked": lambda: seconds(blocked, device=device)}, reps)
    return t["sdpa"] / max(t["blocked"], 1e-9)


def decode_attention_kernel(layer, batch: int, context: int, rotary: bool = False) -> str:
    """The kernel the decode steps of attention ``layer`` should run at ``batch`` sequences of
    up to ``context`` tokens: ``"blocked"`` or ``"sdpa"``. ``rotary``: the model rotates keys
    (it matters where K=V: such a cache holds pre-rotary keys).

    The pinned one (:func:`set_attention_kernel`), else measured by :func:`attention_probe` at
    the layer's sizes, device and dtype and the context rounded down to a power of two (the
    blocked kernel's gain grows with context: rounded up, at 513 tokens the probe measured
    1,024 and chose a kernel that ran the step 5% slower than SDPA), kept on the layer per
    (device, thread count, batch, rounded context, rotary). Not measured, ``"sdpa"``: on the
    CPU, not fp32, or, where Numba does not import, one query head per kv head without rotary
    K=V (the packed kernel is then the same SDPA call); on a CUDA device, where Triton does not
    import or the dtype is not one it computes. On CUDA the Triton kernel lost to SDPA below
    8,192 tokens on the H200 (2026-11-28, docs/bench-history.md), so it is measured there too.
    """
    if CHOICE.pinned is not None:
        return CHOICE.pinned
    cfg, w = layer.cfg, layer.W_in
    rotary = rotary and layer.kv_shared
    if w.device.type == "cuda":
        from qkvlab.kernels import triton_decode
        if not (triton_decode.available() and w.dtype in triton_decode.DTYPES):
            return "sdpa"
    elif w.dtype != torch.float32 or w.device.type != "cpu":
        return "sdpa"
    elif not rotary and cfg.n_kv_heads == cfg.n_heads and not _numba_imports():
        return "sdpa"  # one head per group: the packed kernel is this same SDPA call
    ctx = 1 << max(1, context).bit_length() - 1  # rounded down: blocked gains with context
    key = (str(w.device), torch.get_num_threads(), batch, ctx) + (("rotary",) if rotary else ())
    chosen = layer.__dict__.setdefault("_attention_kernel", {})
    if key not in chosen:
        ratio = attention_probe(batch, cfg.n_heads, cfg.n_kv_heads, ctx, cfg.d_head,
                                layer.kv_shared, rotary=rotary, device=w.device, dtype=w.dtype)
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
