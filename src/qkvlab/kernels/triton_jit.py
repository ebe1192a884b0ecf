"""The Triton kernels of ``kernels.triton_decode`` (see there): imported only through it, on
the first CUDA decode step (or a test under ``TRITON_INTERPRET=1``), so nothing else needs
Triton installed."""

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # fp32 in, fp32 products: not TF32
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _scores(q, kt, DOT: tl.constexpr, IEEE: tl.constexpr):
    """q (BLOCK_R, d) against a tile kt (BLOCK_T, d): (BLOCK_R, BLOCK_T) in fp32. ``tl.dot``
    pads q to 16 rows; a group of fewer query heads takes the products row by row instead, in
    fp32 (one multiply-add per cached element and head, none for padding)."""
    if DOT:
        return _dot(q, tl.trans(kt), IEEE)
    return tl.sum(q.to(tl.float32)[:, None, :] * kt.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _weigh(p, vt, DOT: tl.constexpr, IEEE: tl.constexpr):
    """Weights p (BLOCK_R, BLOCK_T, fp32) times a tile vt (BLOCK_T, dv): (BLOCK_R, dv) in fp32;
    ``tl.dot`` takes p in the cache's dtype, as FlashAttention does."""
    if DOT:
        return _dot(p.to(vt.dtype), vt, IEEE)
    return tl.sum(p[:, :, None] * vt.to(tl.float32)[None, :, :], axis=1)


@triton.jit
def partial(Q, K, V, COS, SIN, M, L, ACC, skb, skg, skt, svb, svg, svt, scos, ssin,
            G, T, CHUNK, S, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DK: tl.constexpr,
            BLOCK_DV: tl.constexpr, BLOCK_HALF: tl.constexpr, SHARED: tl.constexpr,
            ROTARY: tl.constexpr, IEEE: tl.constexpr, DOT: tl.constexpr):
    n = tl.program_id(0)  # b * G + g
    s = tl.program_id(1)
    b, g = n // G, n % G
    start = s * CHUNK
    end = tl.minimum(start + CHUNK, T)
    rows = tl.arange(0, BLOCK_R)
    toks = tl.arange(0, BLOCK_T)
    row_ok = rows < R
    kbase = K + b * skb + g * skg
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    if ROTARY:  # K = V, keys rotated per tile: work in the two halves of the head
        HALF: tl.constexpr = DK // 2
        cols = tl.arange(0, BLOCK_HALF)
        col_ok = cols < HALF
        qmask = row_ok[:, None] & col_ok[None, :]
        qrow = Q + (n * R + rows[:, None]) * DK + cols[None, :]
        q1 = tl.load(qrow, mask=qmask, other=0.0)
        q2 = tl.load(qrow + HALF, mask=qmask, other=0.0)
        acc1 = tl.zeros([BLOCK_R, BLOCK_HALF], tl.float32)
        acc2 = tl.zeros([BLOCK_R, BLOCK_HALF], tl.float32)
        for t in range(start, end, BLOCK_T):
            pos = t + toks
            tmask = (pos < end)[:, None] & col_ok[None, :]
            kp = kbase + pos[:, None] * skt + cols[None, :]
            k1 = tl.load(kp, mask=tmask, other=0.0)  # the tile, read once
            k2 = tl.load(kp + HALF, mask=tmask, other=0.0)
            c = tl.load(COS + pos[:, None] * scos + cols[None, :], mask=tmask, other=0.0)
            sn = tl.load(SIN + pos[:, None] * ssin + cols[None, :], mask=tmask, other=0.0)
            c, sn = c.to(tl.float32), sn.to(tl.float32)
            k1f, k2f = k1.to(tl.float32), k2.to(tl.float32)
            r1 = (k1f * c - k2f * sn).to(k1.dtype)  # R_j k_j, first half
            r2 = (k2f * c + k1f * sn).to(k1.dtype)
            sc = _scores(q1, r1, DOT, IEEE) + _scores(q2, r2, DOT, IEEE)
            sc = tl.where((pos < end)[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc1 = acc1 * alpha[:, None] + _weigh(p, k1, DOT, IEEE)  # the tile as values
            acc2 = acc2 * alpha[:, None] + _weigh(p, k2, DOT, IEEE)
            m_i = m_new
        obase = ACC + ((n * R + rows[:, None]) * S + s) * DV + cols[None, :]
        tl.store(obase, acc1, mask=qmask)
        tl.store(obase + HALF, acc2, mask=qmask)
    else:
        cols = tl.arange(0, BLOCK_DK)
        col_ok = cols < DK
        q = tl.load(Q + (n * R + rows[:, None]) * DK + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        vcols = tl.arange(0, BLOCK_DV)
        vcol_ok = vcols < DV
        vbase = V + b * svb + g * svg
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for t in range(start, end, BLOCK_T):
            pos = t + toks
            t_ok = pos < end
            kt = tl.load(kbase + pos[:, None] * skt + cols[None, :],
                         mask=t_ok[:, None] & col_ok[None, :], other=0.0)
            if SHARED:
                vt = kt  # K = V: the tile just loaded is the values
            else:
                vt = tl.load(vbase + pos[:, None] * svt + vcols[None, :],
                             mask=t_ok[:, None] & vcol_ok[None, :], other=0.0)
            sc = _scores(q, kt, DOT, IEEE)
            sc = tl.where(t_ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _weigh(p, vt, DOT, IEEE)
            m_i = m_new
        tl.store(ACC + ((n * R + rows[:, None]) * S + s) * DV + vcols[None, :], acc,
                 mask=row_ok[:, None] & vcol_ok[None, :])
    tl.store(M + (n * R + rows) * S + s, m_i, mask=row_ok)
    tl.store(L + (n * R + rows) * S + s, l_i, mask=row_ok)


@triton.jit
def combine(M, L, ACC, OUT, S, DV: tl.constexpr, BLOCK_S: tl.constexpr,
            BLOCK_DV: tl.constexpr):
    row = tl.program_id(0)  # (b * G + g) * R + r = b * H + h
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < S
    cols = tl.arange(0, BLOCK_DV)
    c_ok = cols < DV
    m = tl.load(M + row * S + sp, mask=s_ok, other=float("-inf"))
    lsum = tl.load(L + row * S + sp, mask=s_ok, other=0.0)
    w = tl.exp2(m - tl.max(m, 0))
    w = tl.where(s_ok, w, 0.0)
    acc = tl.load(ACC + (row * S + sp[:, None]) * DV + cols[None, :],
                  mask=s_ok[:, None] & c_ok[None, :], other=0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * lsum, 0)
    tl.store(OUT + row * DV + cols, out.to(OUT.dtype.element_ty), mask=c_ok)
