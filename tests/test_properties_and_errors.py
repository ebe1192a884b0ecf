"""Invariants (hypothesis) and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from qkvlab import fold_alt
from qkvlab.attention import AttentionConfig, build_attention
from qkvlab.attention.core import attend
from qkvlab.models import ModelConfig, build_model

SETTINGS = dict(max_examples=25, deadline=None)


def _att(seed, **kw):
    torch.manual_seed(seed)
    return build_attention(AttentionConfig(**kw)).double()


@settings(**SETTINGS)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 9), heads=st.sampled_from([1, 2, 4]),
       causal=st.booleans())
def test_standard_head_output_in_convex_hull_of_values(seed, T, heads, causal):
    att = _att(seed, d_model=8, n_heads=heads, bias=True)
    x = torch.randn(2, T, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    q, k, v = att.project(x)
    z, _ = attend(q, k, v, mask=None, is_causal=causal, scale=att.cfg.inner_scale, dropout_p=0.0,
                  need_weights=False)
    # every head output coordinate lies between the min and max of the values it can see
    for i in range(T):
        seen = v[:, :, : i + 1] if causal else v
        lo, hi = seen.min(dim=2).values, seen.max(dim=2).values
        assert bool((z[:, :, i] >= lo - 1e-12).all() and (z[:, :, i] <= hi + 1e-12).all())


@settings(**SETTINGS)
@given(seed=st.integers(0, 10_000), T=st.integers(2, 8), bias=st.booleans(),
       design=st.sampled_from(["tied_qk", "tied_qkv"]))
def test_tied_qk_scores_are_symmetric(seed, T, bias, design):
    att = _att(seed, d_model=12, n_heads=3, design=design, bias=bias)
    x = torch.randn(1, T, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    # End to end (q @ qᵀ would be symmetric whatever the layer does): the log-weights differ
    # from a symmetric matrix only by row constants, so D = log W - log Wᵀ has D_ij + D_jk = D_ik.
    _, w = att(x, need_weights=True)
    logw = w.log()
    D = logw - logw.transpose(-1, -2)
    cyc = D[..., :, :, None] + D[..., None, :, :] - D[..., :, None, :]  # (i, j, k)
    assert_close(cyc, torch.zeros_like(cyc), rtol=0, atol=1e-10)


@settings(**SETTINGS)
@given(seed=st.integers(0, 10_000), G=st.sampled_from([1, 2, 4]), design=st.sampled_from(["standard", "tied_kv", "alt"]))
def test_gqa_equals_standard_with_repeated_kv(seed, G, design):
    gqa = _att(seed, d_model=16, n_heads=4, n_kv_heads=G, design=design, bias=True)
    mha = _att(seed, d_model=16, n_heads=4, design=design, bias=True)
    with torch.no_grad():
        rows = {s: (gqa._slices[s], gqa._shape[s]) for s in gqa.segments}
        parts, biases = [], []
        for s in gqa.segments:
            sl, (n, d) = rows[s]
            w = gqa.W_in[sl].view(n, d, 16).repeat_interleave(4 // n, 0).reshape(-1, 16)
            b = gqa.b_in[sl].view(n, d).repeat_interleave(4 // n, 0).reshape(-1)
            parts.append(w)
            biases.append(b)
        mha.W_in.copy_(torch.cat(parts))
        mha.b_in.copy_(torch.cat(biases))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        if design == "alt":
            mha.W_mix.copy_(gqa.W_mix)
    x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    assert_close(gqa(x, is_causal=True), mha(x, is_causal=True), rtol=1e-12, atol=1e-12)
    assert_close(gqa.W_K, mha.W_K, rtol=0, atol=0)


@settings(**SETTINGS)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from(["both", "outside", "inside", "none"]),
       d_v=st.sampled_from([None, 3, 6]))
def test_fold_alt_is_exact(seed, scale, d_v):
    att = _att(seed, d_model=12, n_heads=2, design="alt", scale=scale, d_v=d_v, bias=True)
    folded = fold_alt(att)
    assert folded.cfg.design == "standard" and not hasattr(folded, "W_mix")
    x = torch.randn(2, 5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    assert_close(folded(x, is_causal=True), att(x, is_causal=True), rtol=1e-12, atol=1e-12)
    assert_close(folded.OV.full(), att.OV.full(), rtol=1e-12, atol=1e-12)


def test_factored_circuits_match_dense():
    att = _att(0, d_model=16, n_heads=4, design="alt", d_v=3)
    qk = att.QK
    assert qk.shape == (4, 16, 16)
    dense = torch.einsum("hdk,hek->hde", att.W_Q, att.W_K)
    assert_close(qk.full(), dense, rtol=1e-12, atol=1e-12)
    assert_close(qk.norm(), torch.linalg.matrix_norm(dense), rtol=1e-10, atol=1e-12)
    U, S, Vh = att.OV.svd()
    assert_close(U @ torch.diag_embed(S) @ Vh, att.OV.full(), rtol=1e-10, atol=1e-12)
    assert_close(S, torch.linalg.svdvals(att.OV.full())[:, :3], rtol=1e-10, atol=1e-12)


# ---- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,field", [
    (dict(d_model=10, n_heads=4), "d_model"),
    (dict(d_model=16, n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(d_model=16, n_heads=4, design="nope"), "design"),
    (dict(d_model=16, n_heads=4, scale="middle"), "scale"),
    (dict(d_model=16, n_heads=4, design="tied_qk", n_kv_heads=2), "n_kv_heads"),
    (dict(d_model=16, n_heads=4, design="tied_kv", d_v=3), "d_v"),
    (dict(d_model=16, n_heads=4, design="standard", self_mask=True), "self_mask"),
    (dict(d_model=16, n_heads=0), "n_heads"),
    (dict(d_model=16, n_heads=4, dropout=1.5), "dropout"),
])
def test_invalid_attention_configs_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        AttentionConfig(**kw)


def test_invalid_model_configs_name_the_field():
    with pytest.raises(ValueError, match="roles.cross.design"):
        ModelConfig(d_vocab=10, n_ctx=8, roles={"cross": {"design": "bogus"}})
    with pytest.raises(ValueError, match="roles"):
        ModelConfig(d_vocab=10, n_ctx=8, roles={"middle": {}})
    with pytest.raises(ValueError, match="positions"):
        ModelConfig(d_vocab=10, n_ctx=8, positions="sinusoidal")
    with pytest.raises(ValueError, match="kind"):
        build_model(ModelConfig(d_vocab=10, n_ctx=8), "seq2seq")


def test_bad_masks_and_inputs_raise():
    att = _att(0, d_model=16, n_heads=4)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="attn_mask: shape"):
        att(x, attn_mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask: shape"):
        att(x, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool))  # batch 3 != 2: no broadcast
    with pytest.raises(ValueError, match="attn_mask: dtype"):
        att(x, attn_mask=torch.ones(5, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="key_padding_mask: dtype"):
        att(x, key_padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="key_padding_mask: shape"):
        att(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no key left"):
        att(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="x: shape"):
        att(torch.randn(2, 5, 15, dtype=torch.float64))
    model = build_model(ModelConfig(d_vocab=10, n_ctx=8))
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="idx"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 4, dtype=torch.long), 5)
