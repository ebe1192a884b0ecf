"""Measures: equal to their dense definitions, gauge-invariant, and known values on tied designs.

Positive controls use qkvlab's own registered designs through the per-head view: tied Q = K
must give s = 1 and Q–K overlap 1, tied K = V a K–V overlap of 1, random heads the null.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from qkvlab.analysis import measures as M
from qkvlab.analysis.heads import from_attention
from qkvlab.attention import AttentionConfig, FactoredMatrix, build_attention

H, D, dk = 3, 24, 6


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny batched eigh/svd: threads only add overhead (and thrash on a shared CPU)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def view_of(design: str, **kw):
    torch.manual_seed(0)
    att = build_attention(AttentionConfig(d_model=D, n_heads=H, design=design, bias=True, **kw))
    return from_attention(att.double(), 0, "encoder")


# ---- equal to the dense definitions --------------------------------------------------------------
def test_symmetry_score_equals_dense_definition():
    Wq, Wk = rand(H, D, dk, seed=1), rand(H, D, dk, seed=2)
    Mx = Wq @ Wk.transpose(-1, -2)
    sym, anti = (Mx + Mx.mT) / 2, (Mx - Mx.mT) / 2
    want = (sym.square().sum((-1, -2)) - anti.square().sum((-1, -2))) / Mx.square().sum((-1, -2))
    assert_close(M.symmetry_score(Wq, Wk), want, rtol=1e-12, atol=1e-12)
    full = Mx.sum(0, keepdim=True)  # the whole layer: heads summed
    want = (full * full.mT).sum((-1, -2)) / full.square().sum((-1, -2))
    assert_close(M.layer_symmetry(Wq, Wk), want, rtol=1e-12, atol=1e-12)


def test_positive_share_equals_dense_eigenvalues():
    Wq, Wk = rand(H, D, dk, seed=1), rand(H, D, dk, seed=2)
    Mx = Wq @ Wk.transpose(-1, -2)
    lam = torch.linalg.eigvalsh((Mx + Mx.mT) / 2)
    want = lam.clamp_min(0).sum(-1) / lam.abs().sum(-1)
    assert_close(M.positive_share(Wq, Wk), want, rtol=1e-10, atol=1e-10)


def test_singular_values_overlap_copying_equal_dense():
    A, B = rand(H, D, dk, seed=3), rand(H, dk, D, seed=4)
    want = torch.linalg.svdvals(A @ B)[:, :dk]
    assert_close(FactoredMatrix(A, B).singular_values(), want, rtol=1e-8, atol=1e-10)
    assert_close(FactoredMatrix(A, B).svd()[1], want, rtol=1e-8, atol=1e-10)
    Wq, Wv = rand(H, D, dk, seed=5), rand(H, D, dk, seed=6)
    cos = torch.linalg.svdvals(torch.linalg.qr(Wq)[0].mT @ torch.linalg.qr(Wv)[0])
    assert_close(M.principal_cosines(Wq, Wv), cos, rtol=1e-10, atol=1e-10)
    assert_close(M.subspace_overlap(Wq, Wv), (cos ** 2).mean(-1), rtol=1e-10, atol=1e-10)
    lam = torch.linalg.eigvals(Wv @ B)  # D×D: dk nonzero eigenvalues, the rest ≈ 0
    assert_close(M.copying_score(Wv, B), lam.real.sum(-1) / lam.abs().sum(-1),
                 rtol=1e-8, atol=1e-8)


def test_effective_rank_bounds():
    assert_close(M.effective_rank(torch.ones(2, 7, dtype=torch.float64)),
                 torch.full((2,), 7.0, dtype=torch.float64))
    assert_close(M.effective_rank(torch.tensor([[3.0, 0.0, 0.0]], dtype=torch.float64)),
                 torch.ones(1, dtype=torch.float64))


def test_linear_cka_equals_hsic_definition_and_is_orthogonally_invariant():
    X, Y = rand(40, 5, seed=7), rand(40, 4, seed=8)
    C = torch.eye(40, dtype=torch.float64) - 1 / 40

    def hsic(K, L):
        return torch.trace(K @ C @ L @ C)

    K, L = X @ X.T, Y @ Y.T
    want = hsic(K, L) / (hsic(K, K) * hsic(L, L)).sqrt()
    assert_close(M.linear_cka(X, Y), want, rtol=1e-12, atol=1e-12)
    R = torch.linalg.qr(rand(5, 5, seed=9))[0]
    assert_close(M.linear_cka(X, 3.0 * X @ R), torch.tensor(1.0, dtype=torch.float64))


def test_cka_from_covariance_equals_cka_of_activations():
    from qkvlab.analysis.heads import LayerView

    x = rand(50, D, seed=10) @ rand(D, D, seed=11)  # anisotropic inputs
    v = LayerView(0, "encoder", rand(H, D, dk, seed=1), rand(H, D, dk, seed=2),
                  rand(H, D, dk, seed=3), b_Q=rand(H, dk, seed=4), b_K=rand(H, dk, seed=5),
                  b_V=rand(H, dk, seed=6))
    got = M.cka_measures(v, x, x)
    for key, (a, b) in {"cka_qk": "qk", "cka_kv": "kv", "cka_qv": "qv"}.items():
        want = M.linear_cka(v.project(x, a), v.project(x, b))
        assert_close(got[key], want, rtol=1e-10, atol=1e-12, msg=key)


def test_cka_null_matches_random_projections_in_distribution():
    """The eigenvalue shortcut and explicit random projections give the same null."""
    x = rand(300, D, seed=12) @ torch.diag(torch.linspace(0.1, 3, D, dtype=torch.float64))
    x = x @ torch.linalg.qr(rand(D, D, seed=13))[0]  # rotate: the eigenbasis is not the axes
    R = rand(2, 2000, D, dk, seed=14)
    fast = M.cka_null(x, *rand(2, 2000, D, dk, seed=15))["cka_qk"]
    slow = M.linear_cka(x @ R[0], x @ R[1])
    assert abs(fast.mean() - slow.mean()) < 4 * slow.std() / 2000 ** 0.5 * 1.5
    assert abs(fast.std() - slow.std()) < 0.15 * slow.std()


# ---- gauge invariance (hypothesis) ---------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_weight_measures_are_invariant_to_the_gauge(seed):
    """(W_Q·A, W_K·A⁻ᵀ) and (W_V·B, B⁻¹·W_O) give the same head, so the same measures."""
    Wq, Wk, Wv, Wo = (rand(H, D, dk, seed=seed + i) for i in range(4))
    Wo = Wo.mT
    A = rand(H, dk, dk, seed=seed + 5) + 3 * torch.eye(dk, dtype=torch.float64)
    B = rand(H, dk, dk, seed=seed + 6) + 3 * torch.eye(dk, dtype=torch.float64)
    before = M.weight_measures(Wq, Wk, Wv, Wo)
    after = M.weight_measures(Wq @ A, Wk @ torch.linalg.inv(A).mT, Wv @ B,
                              torch.linalg.solve(B, Wo))
    for k in before:
        assert_close(after[k], before[k], rtol=1e-7, atol=1e-8, msg=k)


# ---- positive controls on registered designs -----------------------------------------------------
def test_tied_qk_gives_symmetry_one_and_qk_overlap_one():
    v = view_of("tied_qk")
    m = M.weight_measures(v.W_Q, v.W_K, v.W_V, v.W_O)
    one = torch.ones(H, dtype=torch.float64)
    assert_close(m["symmetry"], one, rtol=0, atol=1e-12)
    assert_close(m["positive_share"], one, rtol=0, atol=1e-10)
    assert_close(m["overlap_qk"], one, rtol=0, atol=1e-10)
    assert_close(M.layer_symmetry(v.W_Q, v.W_K), one[:1], rtol=0, atol=1e-12)


def test_tied_kv_and_tied_qkv_give_overlap_one():
    one = torch.ones(H, dtype=torch.float64)
    v = view_of("tied_kv")
    assert_close(M.subspace_overlap(v.W_K, v.W_V), one, rtol=0, atol=1e-10)
    v = view_of("tied_qkv")
    m = M.weight_measures(v.W_Q, v.W_K, v.W_V, v.W_O)
    for k in ("overlap_qk", "overlap_kv", "overlap_qv", "symmetry"):
        assert_close(m[k], one, rtol=0, atol=1e-10, msg=k)


def test_identical_column_spaces_give_overlap_one_but_not_symmetry_one():
    Wq = rand(H, D, dk, seed=1)
    Wk = Wq @ (rand(H, dk, dk, seed=2) + 3 * torch.eye(dk, dtype=torch.float64))
    assert_close(M.subspace_overlap(Wq, Wk), torch.ones(H, dtype=torch.float64),
                 rtol=0, atol=1e-10)
    assert (M.symmetry_score(Wq, Wk) < 0.999).all()


def test_gqa_view_shares_kv_heads():
    v = view_of("standard", n_kv_heads=1)
    assert_close(M.subspace_overlap(v.W_K, v.W_K[:1].expand_as(v.W_K)),
                 torch.ones(H, dtype=torch.float64), rtol=0, atol=1e-10)


@pytest.mark.parametrize("design", ["standard", "alt"])
def test_random_heads_sit_inside_the_null(design):
    """A freshly initialized head is a random head: every measure within the null's spread.

    ``alt``'s effective W_O is W_hᵀ·W_O, a product of two random matrices, which is not the
    null's single Gaussian W_O: its OV measures are left out.
    """
    torch.manual_seed(1)
    att = build_attention(AttentionConfig(d_model=64, n_heads=8, design=design)).double()
    v = from_attention(att, 0, "decoder")
    got = M.weight_measures(v.W_Q, v.W_K, v.W_V, v.W_O)
    null = M.weight_null(8, 64, 8, 8, n=512, gen=torch.Generator().manual_seed(0))
    for k, vals in got.items():
        if design == "alt" and k in ("eff_rank_ov", "copying"):
            continue
        s = M.summarize(null[k])
        z = (vals - s["null_mean"]) / s["null_std"]
        assert z.abs().max() < 4.5, (k, vals, s)


def test_null_of_overlap_is_d_over_D():
    null = M.weight_null(1, 96, 8, 8, n=400, gen=torch.Generator().manual_seed(0))
    s = M.summarize(null["overlap_qk"])
    assert abs(s["null_mean"] - 8 / 96) < 4 * s["null_std"] / 20  # mean of 400 draws
    assert abs(M.summarize(null["symmetry"])["null_mean"]) < 0.01
