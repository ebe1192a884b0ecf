"""Common suite over every registered design, and each design against the float64 oracle."""

from __future__ import annotations

import io

import pytest
import torch
from safetensors.torch import load, save
from torch.testing import assert_close

from qkvlab.attention import DESIGNS, SCALES, AttentionConfig, build_attention, repeat_kv
from reference import reference_attention

QK_TIED = {"tied_qk", "tied_qkv"}
KV_TIED = {"tied_kv", "tied_qkv"}


def variants():
    """(design, options) pairs covering GQA, d_k != d_v, biases and the self-mask."""
    out = []
    for d in DESIGNS:
        out.append((d, dict(bias=True)))
        if d not in QK_TIED:
            out.append((d, dict(n_kv_heads=2)))
            out.append((d, dict(n_kv_heads=1)))
        if d not in KV_TIED:
            out.append((d, dict(d_v=5)))
        if d in QK_TIED:
            out.append((d, dict(self_mask=True)))
    return out


VARIANTS = variants()
IDS = [f"{d}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for d, o in VARIANTS]


def make(design, seed=0, dtype=torch.float64, **opts):
    torch.manual_seed(seed)
    cfg = AttentionConfig(d_model=16, n_heads=4, design=design, **opts)
    return build_attention(cfg).to(dtype)


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_oracle_self_attention(design, opts, causal):
    att = make(design, **opts)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    ref = reference_attention(att, x, causal=causal)
    assert_close(att(x, is_causal=causal), ref, rtol=1e-12, atol=1e-12)
    out, w = att(x, is_causal=causal, need_weights=True)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert w.shape == (2, 4, 6, 6)
    assert_close(w.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_matches_oracle_cross_attention_with_masks(design, opts):
    att = make(design, **opts)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 16, generator=g, dtype=torch.float64)
    src = torch.randn(2, 7, 16, generator=g, dtype=torch.float64)
    kpm = torch.ones(2, 7, dtype=torch.bool)
    kpm[0, 5:] = False
    bool_mask = torch.rand(4, 7, generator=g) > 0.3
    bool_mask[:, 0] = True
    allowed = kpm[:, None, :] & bool_mask[None]
    ref = reference_attention(att, x, src, allowed=allowed)
    out = att(x, src, key_padding_mask=kpm, attn_mask=bool_mask)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    additive = torch.randn(2, 4, 7, generator=g, dtype=torch.float64)
    ref = reference_attention(att, x, src, allowed=kpm[:, None, :].expand(2, 4, 7), additive=additive)
    assert_close(att(x, src, key_padding_mask=kpm, attn_mask=additive), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("scale", SCALES)
def test_every_scale_placement_matches_oracle(design, scale):
    att = make(design, scale=scale)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert_close(att(x, is_causal=True), reference_attention(att, x, causal=True),
                 rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_gradients_reach_every_parameter(design, opts):
    att = make(design, **opts)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    att(x, is_causal=True).pow(2).sum().backward()
    for name, p in att.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_causality(design, opts):
    att = make(design, **opts)
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 16, dtype=torch.float64)
    a, b = att(x, is_causal=True), att(y, is_causal=True)
    assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-13)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_permutation_equivariance_without_mask(design, opts):
    att = make(design, **opts)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    perm = torch.randperm(7)
    assert_close(att(x[:, perm]), att(x)[:, perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_kv_cache_decode_equals_full_forward(design, opts):
    att = make(design, **opts)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full = att(x, is_causal=True)
    cache = att.new_cache(2, 9)
    parts = [att(x[:, a:b], is_causal=True, cache=cache) for a, b in [(0, 4), (4, 5), (5, 7), (7, 9)]]
    assert_close(torch.cat(parts, dim=1), full, rtol=1e-12, atol=1e-12)
    shared = design in KV_TIED
    assert cache.shared is shared and (cache.k is cache.v) is shared
    per = 2 * att.cfg.n_kv_heads * 9 * 8  # B * G * T * (elements per head, bytes 8 for fp64)
    expected = per * att.cfg.d_head + (0 if shared else per * att.cfg.d_v)
    assert cache.nbytes == expected


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_state_dict_round_trip_keeps_ties(design, opts):
    att = make(design, **opts)
    blob = save({k: v.contiguous() for k, v in att.state_dict().items()})
    fresh = make(design, seed=99, **opts)
    fresh.load_state_dict(load(blob))
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert_close(fresh(x), att(x), rtol=0, atol=0)
    # Tying is one parameter used twice: a gradient step keeps the views identical.
    opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    fresh(x).sum().backward()
    opt.step()
    if design in QK_TIED:
        assert_close(fresh.W_Q, fresh.W_K, rtol=0, atol=0)
    if design in KV_TIED:
        assert_close(fresh.W_K, fresh.W_V, rtol=0, atol=0)
    keys = set(fresh.state_dict())
    assert keys == {"W_in", "out_proj.weight"} | ({"b_in", "out_proj.bias"} if opts.get("bias") else set()) \
        | ({"W_mix"} if design == "alt" else set())


def test_tied_kv_cache_is_half_of_standard():
    std = make("standard").new_cache(1, 32)
    kv = make("tied_kv").new_cache(1, 32)
    assert kv.nbytes * 2 == std.nbytes


def test_torch_save_round_trip_weights_only(tmp_path):
    att = make("tied_qk")
    buf = io.BytesIO()
    torch.save(att.state_dict(), buf)
    buf.seek(0)
    fresh = make("tied_qk", seed=3)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert_close(fresh.W_in, att.W_in, rtol=0, atol=0)


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("dim", [0, 1])
def test_repeat_kv_gives_query_head_h_the_group_h_over_H_by_G(G, dim):
    H = 4
    shape = (G, 3, 5) if dim == 0 else (3, G, 5)  # a per-head weight or (B, G, Tk)
    t = torch.randn(shape, dtype=torch.float64)
    expected = torch.stack([t.select(dim, h // (H // G)) for h in range(H)], dim=dim)
    assert_close(repeat_kv(t, H, dim=dim), expected, rtol=0, atol=0)


def test_repeat_kv_rejects_a_group_count_that_does_not_divide():
    with pytest.raises(ValueError, match="n_kv_heads"):
        repeat_kv(torch.zeros(3, 2), 4, dim=0)
