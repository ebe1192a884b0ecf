"""Common suite over every registered design, and each design against the float64 oracle.

The oracle (``tests/reference.py``) reads only the public per-head view, so these tests check
the view against the forward pass too. Which options a design takes is read from its declared
``segments``: a new design gets the whole suite without a table here.
"""

from __future__ import annotations

import io

import pytest
import torch
from safetensors.torch import load, save
from torch.testing import assert_close

from qkvlab.attention import DESIGNS, SCALES, AttentionConfig, build_attention, repeat_kv
from reference import reference_attention

ROLES = ("q", "k", "v")


def tied(design: str, a: str, b: str) -> bool:
    """Whether ``design`` stores roles ``a`` and ``b`` in one weight block."""
    return DESIGNS[design].tied(a, b)


def everything(design: str) -> dict:
    """Every option the design takes at once: biases, GQA, d_v != d_head, the self-mask."""
    opts = dict(bias=True)
    if not tied(design, "q", "k"):
        opts["n_kv_heads"] = 2
    if not tied(design, "k", "v"):
        opts["d_v"] = 5
    if tied(design, "q", "k"):
        opts["self_mask"] = True
    return opts


def variants():
    """(design, options) pairs covering GQA, d_k != d_v, biases and the self-mask."""
    out = []
    for d in DESIGNS:
        out.append((d, dict(bias=True)))
        if not tied(d, "q", "k"):
            out.append((d, dict(n_kv_heads=2)))
            out.append((d, dict(n_kv_heads=1)))
        if not tied(d, "k", "v"):
            out.append((d, dict(d_v=5)))
        if tied(d, "q", "k"):
            out.append((d, dict(self_mask=True)))
        out.append((d, everything(d)))
    return out


VARIANTS = variants()
IDS = [f"{d}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for d, o in VARIANTS]


def make(design, seed=0, dtype=torch.float64, **opts):
    """A layer whose every parameter is random: biases start at zero, where a bias read from
    the wrong slice would go unnoticed."""
    torch.manual_seed(seed)
    cfg = AttentionConfig(d_model=16, n_heads=4, design=design, **opts)
    att = build_attention(cfg).to(dtype)
    with torch.no_grad():
        for p in att.parameters():
            if not p.any():
                p.normal_(std=0.5)
    return att


def cross_inputs(seed=1):
    """Queries (2, 4, 16), a source (2, 7, 16), a key-padding mask and a boolean mask (4, 7)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 16, generator=g, dtype=torch.float64)
    src = torch.randn(2, 7, 16, generator=g, dtype=torch.float64)
    kpm = torch.ones(2, 7, dtype=torch.bool)
    kpm[0, 5:] = False
    bool_mask = torch.rand(4, 7, generator=g) > 0.3
    bool_mask[:, 0] = True
    return x, src, kpm, bool_mask


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_oracle_self_attention(design, opts, causal):
    att = make(design, **opts)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    ref, ref_w = reference_attention(att, x, causal=causal, need_weights=True)
    assert_close(att(x, is_causal=causal), ref, rtol=1e-12, atol=1e-12)  # fused SDPA
    out, w = att(x, is_causal=causal, need_weights=True)  # explicit path
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert_close(w, ref_w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_matches_oracle_cross_attention_with_masks(design, opts):
    att = make(design, **opts)
    x, src, kpm, bool_mask = cross_inputs()
    allowed = kpm[:, None, :] & bool_mask[None]
    ref, ref_w = reference_attention(att, x, src, allowed=allowed, need_weights=True)
    out = att(x, src, key_padding_mask=kpm, attn_mask=bool_mask)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    out, w = att(x, src, key_padding_mask=kpm, attn_mask=bool_mask, need_weights=True)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert_close(w, ref_w, rtol=1e-12, atol=1e-12)
    additive = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(2),
                           dtype=torch.float64)
    ref = reference_attention(att, x, src, allowed=kpm[:, None, :].expand(2, 4, 7), additive=additive)
    assert_close(att(x, src, key_padding_mask=kpm, attn_mask=additive), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("extra", [False, True], ids=["plain", "everything"])
def test_every_scale_placement_matches_oracle(design, scale, extra):
    """The outer scale is 1/√d_head (not 1/√d_v) and lives in W_O, the inner one in the oracle."""
    att = make(design, scale=scale, **(everything(design) if extra else {}))
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert_close(att(x, is_causal=True), reference_attention(att, x, causal=True),
                 rtol=1e-12, atol=1e-12)
    x, src, kpm, bool_mask = cross_inputs()
    assert_close(att(x, src, key_padding_mask=kpm, attn_mask=bool_mask),
                 reference_attention(att, x, src, allowed=kpm[:, None, :] & bool_mask[None]),
                 rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_gradients_match_the_oracle_through_the_view(design, opts):
    """Backpropagating the oracle through the public view gives every parameter (and the input)
    the module's gradient; ``autograd.grad`` raises if a parameter reaches neither."""
    att = make(design, **opts)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5, 16, dtype=torch.float64)  # a random linear loss
    names, params = zip(*att.named_parameters())
    got = torch.autograd.grad((att(x, is_causal=True) * w).sum(), (x, *params))
    ref = reference_attention(att, x, causal=True, view=att.view(grad=True))
    want = torch.autograd.grad((ref * w).sum(), (x, *params))
    for name, a, b in zip(("x", *names), got, want):
        assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_a_step_moves_each_role_by_the_summed_gradients_of_the_roles_it_shares(design, opts):
    """Tying is one block used in several roles: an SGD step moves W_Q, W_K, W_V (and b_Q, b_K,
    b_V) by the sum of the gradients an *untied* float64 layer gives the roles stored in that
    block, summed over the query heads of a GQA group too (the adjoint of ``repeat_kv``)."""
    att = make(design, **opts)
    H = att.cfg.n_heads
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    w = torch.randn(2, 5, 16, dtype=torch.float64)
    (att(x, is_causal=True) * w).sum().backward()
    untied = att.view().leaves()
    (reference_attention(att, x, causal=True, view=untied) * w).sum().backward()
    before = att.view()
    torch.optim.SGD(att.parameters(), lr=1.0).step()
    after = att.view()

    def stored(name: str, role: str) -> torch.Tensor:
        """The untied gradient of ``name`` (W or b) for ``role``, summed onto stored heads."""
        g = getattr(untied, f"{name}_{role.upper()}").grad  # (H, ...)
        n = H if "q" in DESIGNS[design].segment_of(role) else att.cfg.n_kv_heads
        return g.reshape(n, H // n, *g.shape[1:]).sum(1)  # (n, ...)

    for name in ("W", "b") if opts.get("bias") else ("W",):
        for role in ROLES:
            key = f"{name}_{role.upper()}"
            if DESIGNS[design].segment_of(role) is None:  # no weight: the view stays zero
                assert not getattr(before, key).any() and not getattr(after, key).any(), key
                continue
            shared = sum(stored(name, r) for r in ROLES if tied(design, r, role))
            want = shared.repeat_interleave(H // shared.shape[0], 0)  # back to (H, ...)
            assert_close(getattr(before, key) - getattr(after, key), want,
                         rtol=1e-10, atol=1e-12, msg=lambda m, key=key: f"{key}: {m}")


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
    shared = tied(design, "k", "v")
    assert cache.shared is shared and (cache.k is cache.v) is shared
    per = 2 * att.cfg.n_kv_heads * 9 * 8  # B * G * T * (elements per head, bytes 8 for fp64)
    expected = per * att.cfg.d_head + (0 if shared else per * att.cfg.d_v)
    assert cache.nbytes == expected


@pytest.mark.parametrize("design,opts", VARIANTS, ids=IDS)
def test_state_dict_round_trip_stores_each_tied_block_once(design, opts):
    att = make(design, **opts)
    blob = save({k: v.contiguous() for k, v in att.state_dict().items()})
    fresh = make(design, seed=99, **opts)
    fresh.load_state_dict(load(blob))
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert_close(fresh(x), att(x), rtol=0, atol=0)
    state = fresh.state_dict()
    assert set(state) == {"W_in", "out_proj.weight"} \
        | ({"b_in", "out_proj.bias"} if opts.get("bias") else set()) \
        | ({"W_mix"} if design == "alt" else set())
    # W_in holds one block per distinct segment: n heads (H with q, else G) of width d each
    c = att.cfg
    blocks = {DESIGNS[design].segment_of(r): r for r in ROLES}  # segment -> a role it serves
    blocks.pop(None, None)  # roles the design does not compute (uniform's q, k)
    rows = sum((c.n_heads if "q" in seg else c.n_kv_heads) * (c.d_v if r == "v" else c.d_head)
               for seg, r in blocks.items())
    assert tuple(state["W_in"].shape) == (rows, c.d_model)


def test_tied_kv_cache_is_half_of_standard():
    std = make("standard").new_cache(1, 32)
    kv = make("tied_kv").new_cache(1, 32)
    assert kv.nbytes * 2 == std.nbytes


def test_torch_save_round_trip_weights_only(tmp_path):
    att = make("tied_qk", bias=True)
    buf = io.BytesIO()
    torch.save(att.state_dict(), buf)
    buf.seek(0)
    fresh = make("tied_qk", seed=3, bias=True)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    for key, value in att.state_dict().items():
        assert_close(fresh.state_dict()[key], value, rtol=0, atol=0, msg=key)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert_close(fresh(x), att(x), rtol=0, atol=0)


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


def test_alt_with_identity_mix_init_computes_standard():
    """mix_init="identity" sets W_h = √d_k·I against alt's outer 1/√d_k: with the same W_in
    and W_O the layer is standard attention (float64, whole outputs), and every other weight
    equals the random-init alt's of the same seed."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # W_h = √d_k·I exactly as fp64 computes it
    try:
        torch.manual_seed(0)
        alt = build_attention(AttentionConfig(d_model=32, n_heads=4, design="alt",
                                              mix_init="identity"))
        torch.manual_seed(0)
        rnd = build_attention(AttentionConfig(d_model=32, n_heads=4, design="alt"))
        std = build_attention(AttentionConfig(d_model=32, n_heads=4))
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        std.W_in.copy_(alt.W_in)
        std.out_proj.weight.copy_(alt.out_proj.weight)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(alt(x, is_causal=True), std(x, is_causal=True), rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(alt.W_mix, torch.eye(8, dtype=torch.float64).expand(4, 8, 8)
                               * 8 ** 0.5, rtol=1e-15, atol=0)
    torch.testing.assert_close(alt.W_in, rnd.W_in, rtol=0, atol=0)
    torch.testing.assert_close(alt.out_proj.weight, rnd.out_proj.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match="mix_init: design 'standard' has no mixing matrix"):
        AttentionConfig(d_model=32, n_heads=4, mix_init="identity")
    with pytest.raises(ValueError, match=r"mix_init: 'eye' is not one of \['random', 'identity'\]"):
        AttentionConfig(d_model=32, n_heads=4, design="alt", mix_init="eye")


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_returns_the_mean_of_the_visible_values(causal):
    """The control, by its own equation and not through the oracle: each head's output is the
    plain mean of s W_V[h] + b_V[h] over the keys a query may see, then W_O, in float64;
    self- and cross-attention with padding and a boolean mask, GQA values, d_v != d_head."""
    att = make("uniform", bias=True, n_kv_heads=2, d_v=5)
    x, src, kpm, bool_mask = cross_inputs()
    view = att.view()
    assert not view.W_Q.any() and not view.W_K.any()
    cases = [(x, None, torch.ones(2, 4, 4, dtype=torch.bool), {})]
    if causal:
        cases[0] = (x, None, torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 4, 4),
                    dict(is_causal=True))
    else:
        cases.append((x, src, kpm[:, None, :] & bool_mask[None],
                      dict(key_padding_mask=kpm, attn_mask=bool_mask)))
    for q_in, s_in, allowed, kw in cases:
        s = q_in if s_in is None else s_in
        v = torch.einsum("btd,hde->bhte", s, view.W_V) + view.b_V[None, :, None]  # (B,H,Tk,dv)
        w = allowed[:, None].double() / allowed.sum(-1)[:, None, :, None]  # (B, 1, Tq, Tk)
        want = torch.einsum("bhqk,bhke,hed->bqd", w.expand(-1, 4, -1, -1), v, view.W_O) \
            + view.b_O
        out, weights = att(q_in, s_in, need_weights=True, **kw)
        assert_close(out, want, rtol=1e-12, atol=1e-12)
        assert_close(weights, w.expand(-1, 4, -1, -1), rtol=1e-12, atol=1e-15)
        assert_close(att(q_in, s_in, **kw), want, rtol=1e-12, atol=1e-12)


def test_uniform_has_no_query_or_key_parameters():
    std, uni = make("standard"), make("uniform")
    assert set(dict(uni.named_parameters())) == {"W_in", "out_proj.weight"}
    assert uni.W_in.shape[0] * 3 == std.W_in.shape[0]  # W_V's rows only
    with pytest.raises(ValueError, match="self_mask: only designs with Q = K"):
        AttentionConfig(d_model=16, n_heads=4, design="uniform", self_mask=True)
