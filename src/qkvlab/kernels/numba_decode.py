"""One-query decode attention on the CPU in one pass over the cache, compiled with Numba.

A decode step attends one new query per sequence to its whole cache, so at long context the
step should be a read of the cache. PyTorch's CPU SDPA reads it at about half the bandwidth one
thread reaches (standard at 32k x 16: 182-212 ms for 2.15 GB against this kernel's 91-134,
one thread, AMD EPYC, 2026-11-28), and eager PyTorch cannot fuse the key rotation of a rotary
K=V cache into the product at all (its eager blocks ran at 0.26-0.33x rotary standard). Here
each row (sequence, kv head) is walked once, token by token (four at a time where its
arithmetic, not its bytes, bounds it): the key row is loaded once and scored against the row's
H/G query heads (GQA/MQA: one read serves the group), and the value row (for K=V the same
bytes, still in L1) added under an online softmax (Milakov & Gimelshein 2018).

Rotary K=V: the cache holds the pre-rotary k, which are the values; the keys are R_j k_j,
rotated as each row is loaded (rotate-half: R_j k = [k₁ cos − k₂ sin, k₂ cos + k₁ sin], the
tables' row j) into a d-float buffer that the score reads from L1, so the rotation costs
arithmetic, not a second read or a written copy.

Numba compiles the loop with LLVM on first use (a few seconds) and caches the machine code
beside this file (``cache=True``). Rows are split over ``torch.get_num_threads()`` plain
threads (the kernel releases the GIL). Only float32 on the CPU: ``kernels.attend`` sends
everything else to SDPA or its eager blocks, and does so where Numba does not import.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit
from torch import Tensor

from qkvlab.kernels.attend import shares_storage

__all__ = ["decode"]

# Reassociation (the sums vectorize in any order) and contraction to FMA; not "no infinities":
# the running max starts at -inf.
FAST = {"reassoc", "contract", "nsz", "arcp"}


def _jit(fn):
    """``fn`` compiled (GIL released, ``FAST`` math), its machine code cached beside the source
    or in the user's cache folder; where neither can be written (a read-only install, no home)
    Numba refuses the cache at decoration, and ``fn`` then compiles once per process."""
    try:
        return njit(fastmath=FAST, cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(fastmath=FAST, nogil=True)(fn)


@_jit
def _kernel(q, kf, koff, ks, vf, voff, vs, cos, sin, rotary, quads, T, out,
            n0, n1):  # pragma: no cover - compiled
    """Rows n0..n1-1 of: q (N, r, d), scaled queries (rotated to their position), r per kv
    row; kf/vf, the caches' storage (1-D), row n's token j at ``koff[n] + j·ks`` (``voff``,
    ``vs`` for the values); ``rotary``: the keys are R_j k_j by the tables cos, sin (T, d/2);
    out (N, r, dv).

    One pass per row. Each token's key row is loaded once (rotated into ``kr`` where rotary),
    scored against the row's r queries, and its value row (for K=V the same bytes, in L1)
    added under an online softmax whose running max is raised only when a score exceeds it
    (then the sums so far are rescaled: rare after the first tokens). With ``quads`` four
    tokens go at once: their four dot products share one loop (four independent sums, where
    one dot of 64 is a chain of dependent vector FMAs) and their values one sweep of the
    accumulator. Rows are read through slices (``kf[a:b]``), whose loops LLVM vectorizes
    (indexed as ``kf[a + c]`` it did not: 116 against 18 ms for the same sum, 2026-11-28).
    The quads and the last tokens each spell out the rotation and the max update: the same
    code as ``inline="always"`` helpers gave bit-identical outputs 1.2-2.6x slower (rotary K=V
    474 against 180 ms at 32k x 16, one thread)."""
    r, d = q.shape[1], q.shape[2]
    dv = out.shape[2]
    h = d // 2
    kr = np.empty((4, d), dtype=np.float32)
    acc = np.empty((r, dv), dtype=np.float32)
    m = np.empty(r, dtype=np.float32)
    norm = np.empty(r, dtype=np.float32)
    T4 = T - T % 4 if quads else 0
    for n in range(n0, n1):
        acc[:] = 0
        m[:] = -np.inf
        norm[:] = 0
        for j0 in range(0, T4, 4):
            kb = koff[n] + j0 * ks
            if rotary:  # R_j k_j, rotate-half
                for u in range(4):
                    b = kb + u * ks
                    k1, k2 = kf[b:b + h], kf[b + h:b + d]
                    cj, sj, ku = cos[j0 + u], sin[j0 + u], kr[u]
                    for c in range(h):
                        ku[c] = k1[c] * cj[c] - k2[c] * sj[c]
                        ku[h + c] = k2[c] * cj[c] + k1[c] * sj[c]
                x0, x1, x2, x3 = kr[0], kr[1], kr[2], kr[3]
            else:
                x0, x1 = kf[kb:kb + d], kf[kb + ks:kb + ks + d]
                x2, x3 = kf[kb + 2 * ks:kb + 2 * ks + d], kf[kb + 3 * ks:kb + 3 * ks + d]
            vb = voff[n] + j0 * vs
            v0, v1 = vf[vb:vb + dv], vf[vb + vs:vb + vs + dv]
            v2, v3 = vf[vb + 2 * vs:vb + 2 * vs + dv], vf[vb + 3 * vs:vb + 3 * vs + dv]
            for i in range(r):
                qi = q[n, i]
                s0 = s1 = s2 = s3 = np.float32(0.0)
                for c in range(d):
                    qc = qi[c]
                    s0 += x0[c] * qc
                    s1 += x1[c] * qc
                    s2 += x2[c] * qc
                    s3 += x3[c] * qc
                mx = max(max(s0, s1), max(s2, s3))
                a = acc[i]
                if mx > m[i]:  # a new running max: rescale what came before
                    corr = np.exp(np.float32(m[i] - mx))
                    norm[i] *= corr
                    for c in range(dv):
                        a[c] *= corr
                    m[i] = mx
                mi = m[i]
                p0, p1 = np.exp(np.float32(s0 - mi)), np.exp(np.float32(s1 - mi))
                p2, p3 = np.exp(np.float32(s2 - mi)), np.exp(np.float32(s3 - mi))
                norm[i] += (p0 + p1) + (p2 + p3)
                for c in range(dv):
                    a[c] += p0 * v0[c] + p1 * v1[c] + p2 * v2[c] + p3 * v3[c]
        for j in range(T4, T):  # token by token (all of them without quads)
            kb = koff[n] + j * ks
            if rotary:
                k1, k2 = kf[kb:kb + h], kf[kb + h:kb + d]
                cj, sj, key = cos[j], sin[j], kr[0]
                for c in range(h):
                    key[c] = k1[c] * cj[c] - k2[c] * sj[c]
                    key[h + c] = k2[c] * cj[c] + k1[c] * sj[c]
            else:
                key = kf[kb:kb + d]
            vb = voff[n] + j * vs
            row = vf[vb:vb + dv]
            for i in range(r):
                qi = q[n, i]
                s = np.float32(0.0)
                for c in range(d):
                    s += key[c] * qi[c]
                a = acc[i]
                if s > m[i]:
                    corr = np.exp(np.float32(m[i] - s))
                    norm[i] *= corr
                    for c in range(dv):
                        a[c] *= corr
                    m[i] = s
                p = np.exp(np.float32(s - m[i]))
                norm[i] += p
                for c in range(dv):
                    a[c] += p * row[c]
        for i in range(r):
            o = out[n, i]
            for c in range(dv):
                o[c] = acc[i, c] / norm[i]


def _rows(x: Tensor) -> tuple[np.ndarray, np.ndarray, int]:
    """A (B, G, T, d) cache view as (its storage from the view's first element, as a 1-D
    array; each (b, g) row's offset into it; the token stride)."""
    B, G, T, d = x.shape
    s0, s1, s2, _ = x.stride()
    extent = (B - 1) * s0 + (G - 1) * s1 + (T - 1) * s2 + d
    flat = x.as_strided((extent,), (1,), x.storage_offset()).detach().numpy()
    offs = (np.arange(B, dtype=np.int64)[:, None] * s0
            + np.arange(G, dtype=np.int64)[None, :] * s1).reshape(-1)
    return flat, offs, s2


def decode(q: Tensor, k: Tensor, v: Tensor, scale: float,
           rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """softmax(scale · q kᵀ) v for one query per sequence, GQA/MQA when k has fewer heads:
    q (B, H, 1, d); k (B, G, T, d), G dividing H (query head h reads kv head h // (H/G));
    v (B, G, T, dv) (``k`` itself for a K=V cache). ``rope``: rotate-half (cos, sin) tables of
    ≥ T rows whose halves repeat (the first half is read): the keys are then k rotated to
    positions 0..T−1 and the values v unrotated, ``q`` already rotated to its position. All
    float32 on the CPU with unit stride in the last dimension (``kernels.attend`` checks
    it). Runs on ``torch.get_num_threads()`` threads, rows (sequence, kv head) split among them."""
    B, H, _, d = q.shape
    G, T, dv = k.shape[1], k.shape[2], v.shape[-1]
    qs = (q.detach().reshape(B * G, H // G, d) * scale).contiguous().numpy()
    # K=V: the cache's keys() and values() are two views of one tensor, so not ``v is k``
    shared = v is k or shares_storage(k, v)
    kf, koff, ks = _rows(k)
    vf, voff, vs = (kf, koff, ks) if shared else _rows(v)
    if rope is None:
        c = s = np.empty((0, d // 2), dtype=np.float32)
    else:  # compact copies of the first halves: every row rereads them, and at half the bytes
        # they stay in L3 (the full-width rows, uncopied, ran rotary K=V at 32k x 16 in 362
        # against 130 ms, one thread, 2026-11-28)
        c = rope[0][:T, :d // 2].contiguous().numpy()
        s = rope[1][:T, :d // 2].contiguous().numpy()
    N = B * G
    out = np.empty((N, H // G, dv), dtype=np.float32)
    # four tokens at a time where a row's compute bounds it (K=V, a GQA group); standard's rows
    # (one query head, separate values) ran token by token faster: 91-134 against 121-173 ms
    # at 32k x 16, where K=V took 67-71 against 77-96 and MQA 40-51 against 50-64 (one thread,
    # three interleaved runs, AMD EPYC, 2026-11-28)
    quads = shared or H // G > 1
    args = (qs, kf, koff, ks, vf, voff, vs, c, s, rope is not None, quads, T, out)
    parts = min(N, torch.get_num_threads())
    bounds = [N * i // parts for i in range(parts + 1)]
    if parts == 1:
        _kernel(*args, 0, N)
    else:  # the kernel releases the GIL: rows split over threads, the first part on this one
        done = [_pool(parts - 1).submit(_kernel, *args, a, b)
                for a, b in zip(bounds[1:-1], bounds[2:])]
        _kernel(*args, 0, bounds[1])
        for f in done:
            f.result()
    return torch.from_numpy(out).view(B, H, 1, dv)


_POOL: ThreadPoolExecutor | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """Threads for the row parts beyond the caller's own (plain threads, not Numba's threading
    layers: its OpenMP layer kills a process that forks after using it, as tests and
    ``subprocess`` may)."""
    global _POOL
    if _POOL is None or _POOL._max_workers < workers:
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="qkvlab-decode")
    return _POOL


def _forget_pool() -> None:
    global _POOL
    _POOL = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)
