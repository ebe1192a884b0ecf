"""One-query decode attention on a GPU in Triton, split along the context (FlashDecoding).

The same function as ``kernels.attend.decode_attention``, on the same shapes: q (B, H, 1, dk),
k (B, G, T, dk), v (B, G, T, dv), G dividing H, optional rotary tables for a K=V cache of
pre-rotary keys. Two kernels:

1. ``partial``: one program per (batch b, kv head g, context split s). It loads the H/G query
   heads of group g once (a (H/G, dk) tile, padded to 16 rows for ``tl.dot``) and walks its
   split's tokens in tiles of ``BLOCK_T``: each tile of the cache is loaded once and serves
   every query head of the group (GQA, MQA: one read per kv group, not per query head), and
   where K is V (one buffer) the same loaded tile is the keys and the values. With rotary, the
   tile is loaded as its two halves k₁, k₂ (rotate-half layout) and rotated in registers,
   R_j k = [k₁·cos − k₂·sin, k₂·cos + k₁·sin], for the scores ⟨R_i q, R_j k_j⟩ (q arrives
   rotated), while the unrotated halves are the values: the cache is still read once.
   A group of one or two query heads (standard and K=V, GQA at H/2) takes the two products
   row by row in fp32 (``DOT`` off), larger groups with ``tl.dot``, since ``tl.dot``
   pads its rows to 16: on fp32 caches, where ``tl.dot`` is plain multiply-adds, one head
   did 16x the arithmetic it needed (256 FFMA per thread per 32-token tile at d = 64 in the
   compiled sm_90 code, 16 without the padding), and on the H200 the step's time followed
   the tiles, not the bytes: K=V decoded 0.99x standard. It keeps an online softmax (running
   max m, normalizer l, unnormalized sum acc; base 2, the scale folded with log₂e into q) and
   writes m, l, acc per split.
2. ``combine``: one program per (b, query head): out = Σ_s 2^(m_s − M) acc_s / Σ_s 2^(m_s − M) l_s
   with M = max_s m_s.

Triton is optional (the ``triton`` extra): this module imports it only inside functions, and
``kernels.attend`` imports this module only for a CUDA tensor. Under ``TRITON_INTERPRET=1``
the kernels run on CPU tensors too (the tests). Timed on a GPU once, before the row-by-row
products (H200, docs/bench-history.md); their tiles, warps and split count are chosen by
compiling for sm_90 without a GPU (``scripts/triton-sm90.py``: ``triton.compile`` for
``GPUTarget("cuda", 90, 32)``, then ``ptxas -v`` and the SASS's FFMA count), not by timing.
With ``tl.dot``, 32-token tiles and 8 warps use no spill stores at d = 128 in fp32, fp16 and
bf16, standard and rotary K=V (64-token tiles spilled in fp32).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_T = 32  # context tokens per tile, with tl.dot
MAX_TILE = 64  # context tokens per tile, row by row
# row by row: the (heads, tokens, d) product of a tile, 8 fp32 a thread at 8 warps; at d 64 and
# 128, one or two heads, it compiles to <= 64 registers for sm_90 (twice it: 104-242)
TILE_ELEMS = 2048
MAX_ROWS = 2  # query heads per group taken row by row; more take tl.dot (padding <= 4x)
NUM_WARPS = 8
PROGRAMS_PER_SM = 4  # 8 warps of <= 64 registers: four programs fill an SM's 64k registers
MIN_DOT = 16  # tl.dot wants each of its dimensions at least 16
LOG2E = math.log2(math.e)


@functools.cache
def available() -> bool:
    """Whether Triton imports (the ``triton`` extra is installed)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # an absent or broken install: decode stays on the PyTorch kernels
        return False
    return True


def supports(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel computes this step: one dtype it handles for q, k and v."""
    return q.dtype in DTYPES and k.dtype == q.dtype and v.dtype == q.dtype


def _pow2(n: int, least: int = MIN_DOT) -> int:
    return max(least, 1 << max(0, n - 1).bit_length())


def uses_dot(R: int) -> bool:
    """Whether a group of ``R`` query heads takes its products with ``tl.dot`` (padded to 16
    rows) rather than row by row (``MAX_ROWS`` heads at most: more would need smaller tiles
    or more registers than tl.dot's padding costs)."""
    return R > MAX_ROWS


def tile(R: int, d: int) -> int:
    """Context tokens per tile for a group of ``R`` query heads of width ``d``: ``BLOCK_T`` with
    ``tl.dot``; row by row, as many as keep the (heads, tokens, d) product within
    ``TILE_ELEMS`` (at most ``MAX_TILE``)."""
    if uses_dot(R):
        return BLOCK_T
    return max(1, min(MAX_TILE, TILE_ELEMS // (_pow2(R, 1) * _pow2(d))))


def splits(n_programs: int, T: int, device: torch.device, block_t: int = BLOCK_T) -> int:
    """Context splits per (b, g): enough programs for about ``PROGRAMS_PER_SM`` per streaming
    multiprocessor, never more than the tiles of the context (4 "multiprocessors" off a GPU)."""
    sms = (torch.cuda.get_device_properties(device).multi_processor_count
           if device.type == "cuda" else 4)
    return max(1, min(-(-T // block_t), -(-PROGRAMS_PER_SM * sms // n_programs)))


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                     rope: tuple[Tensor, Tensor] | None = None, n_splits: int | None = None,
                     block_t: int | None = None) -> Tensor:
    """softmax(scale · q keysᵀ) v for one query per sequence; keys = k, or with ``rope``
    (cos, sin), tables of at least T rows in the rotate-half layout, k rotated to positions
    0..T−1. Returns (B, H, 1, dv) in q's dtype. ``n_splits``: context splits per (b, g)
    (default :func:`splits`); ``block_t``: tokens per tile (a power of two, at least 16 where
    the group takes ``tl.dot``; default :func:`tile`).

    Raises:
        ValueError: more than one query, G not dividing H, or a dtype the kernel does not take.
    """
    B, H, Tq, dk = q.shape
    G, T, dv = k.shape[1], k.shape[2], v.shape[-1]
    if Tq != 1 or H % G or T < 1:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} must hold one query, G={G} must "
                         f"divide H={H}, and the cache hold a token (T={T})")
    if not supports(q, k, v):
        raise ValueError(f"decode_attention: dtypes {q.dtype}, {k.dtype}, {v.dtype}: the Triton "
                         f"kernel takes one of {DTYPES} for all three")
    shared = (k.data_ptr() == v.data_ptr() and k.shape == v.shape and k.stride() == v.stride())
    if rope is not None and not shared:  # separate values: nothing to share, rotate first
        cos, sin = rope[0][:T].to(k.dtype), rope[1][:T].to(k.dtype)
        x1, x2 = k.chunk(2, dim=-1)
        k, rope = k * cos + torch.cat([-x2, x1], dim=-1) * sin, None
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), (k.contiguous() if shared else v.contiguous())
    R, N = H // G, B * G
    dot = uses_dot(R)
    block_t = block_t or tile(R, dk)
    qs = (q.reshape(N, R, dk).float() * (scale * LOG2E)).to(k.dtype).contiguous()
    S = n_splits or splits(N, T, q.device, block_t)
    chunk = -(-(-(-T // S)) // block_t) * block_t  # tokens per split, whole tiles
    S = -(-T // chunk)
    m = torch.empty(N, R, S, device=q.device, dtype=torch.float32)
    lsum = torch.empty_like(m)
    acc = torch.empty(N, R, S, dv, device=q.device, dtype=torch.float32)
    if rope is not None:
        half = dk // 2
        cos, sin = rope[0][:T, :half], rope[1][:T, :half]  # the halves repeat: one is enough
        if cos.stride(-1) != 1 or sin.stride(-1) != 1:
            cos, sin = cos.contiguous(), sin.contiguous()
    else:
        cos = sin = qs  # unused
    partial, combine = _kernels()
    partial[(N, S)](
        qs, k, v, cos, sin, m, lsum, acc,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        cos.stride(0), sin.stride(0), G, T, chunk, S,
        R=R, DK=dk, DV=dv, BLOCK_R=_pow2(R, MIN_DOT if dot else 1), BLOCK_T=block_t,
        BLOCK_DK=_pow2(dk), BLOCK_DV=_pow2(dv), BLOCK_HALF=_pow2(dk // 2), SHARED=shared,
        ROTARY=rope is not None, IEEE=k.dtype == torch.float32, DOT=dot, num_warps=NUM_WARPS)
    out = torch.empty(N * R, dv, device=q.device, dtype=q.dtype)
    combine[(N * R,)](m, lsum, acc, out, S, DV=dv, BLOCK_S=_pow2(S), BLOCK_DV=_pow2(dv))
    return out.view(B, H, 1, dv)


@functools.cache
def _kernels():
    """The two jitted kernels (``kernels.triton_jit``, which imports Triton), on first use."""
    from qkvlab.kernels import triton_jit
    return triton_jit.partial, triton_jit.combine
