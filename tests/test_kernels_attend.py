"""The one-query decode attention (kernels.attend) equals float64 attention for every cache
layout (separate K and V, one K=V buffer, GQA, MQA), in both of its block paths, and runs only
inside generate's token loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from qkvlab.attention import DESIGNS
from qkvlab.attention.core import attend
from qkvlab.kernels import attend as kattend
from qkvlab.kernels import decode_attention, set_attention_kernel
from qkvlab.models import ModelConfig, build_model

TINY = dict(d_vocab=37, n_ctx=16, d_model=32, n_layers=2, n_heads=4)
FP32 = dict(rtol=1e-5, atol=1e-6)
LAYOUTS = {"standard": (8, False), "tied_kv": (8, True), "gqa_half": (4, False),
           "gqa_quarter": (2, False), "mqa": (1, False), "tied_kv_gqa": (2, True)}


@pytest.fixture
def kernel(monkeypatch):
    """Pin the decode attention for one test; the process's setting is restored afterwards."""
    monkeypatch.setattr(kattend.CHOICE, "pinned", kattend.CHOICE.pinned)
    return set_attention_kernel


def reference(q, k, v, scale):
    """Float64 softmax(scale q kᵀ) v with the kv heads repeated per group (h -> h // (H/G))."""
    H, G = q.shape[1], k.shape[1]
    k, v = (t.double().repeat_interleave(H // G, dim=1) for t in (k, v))
    return ((q.double() @ k.mT) * scale).softmax(-1) @ v


def cache(B, G, T, d, shared, max_len=None):
    """k, v as KVCache hands them over: narrow views of a longer buffer, one buffer if shared."""
    buf = torch.randn(B, G, max_len or T + 3, d)
    k = buf.narrow(2, 0, T)
    return k, k if shared else torch.randn(B, G, max_len or T + 3, d).narrow(2, 0, T)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("B,T", [(1, 1), (1, 37), (3, 200), (2, 1000)])
@pytest.mark.parametrize("block_bytes", [kattend.BLOCK_BYTES, 4096, 512])
def test_decode_attention_equals_float64(layout, B, T, block_bytes):
    """Whole outputs, two-sided: default blocks (whole sequences), blocks of a few sequences
    (4096 B), and blocks shorter than a sequence (512 B: the online softmax over token blocks)."""
    G, shared = LAYOUTS[layout]
    torch.manual_seed(B * T)
    q = torch.randn(B, 8, 1, 16) * 3  # peaked softmax: the online rescaling matters
    k, v = cache(B, G, T, 16, shared)
    assert kattend.shares_storage(k, v) == shared
    out = decode_attention(q, k, v, 0.25, block_bytes=block_bytes)
    assert out.shape == (B, 8, 1, 16)
    assert_close(out.double(), reference(q, k, v, 0.25), **FP32)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block_bytes", [kattend.BLOCK_BYTES, 4096, 512])
def test_decode_products_issue_the_kernels_products(layout, block_bytes, monkeypatch):
    """decode_products (the bench's products bound) makes the kernel's batched GEMMs: the same
    operand shapes and strides, in the same order, in each block path."""
    G, shared = LAYOUTS[layout]
    q, (k, v) = torch.randn(3, 8, 1, 16), cache(3, G, 200, 16, shared)
    calls, bmm = [], torch.bmm

    def record(a, b, **kw):
        calls[-1].append((a.shape, a.stride(), b.shape, b.stride()))
        return bmm(a, b, **kw)

    monkeypatch.setattr(torch, "bmm", record)
    for fn in (decode_attention, kattend.decode_products):
        calls.append([])
        fn(q, k, v, 0.25, block_bytes=block_bytes)
    assert calls[0] == calls[1] and len(calls[0]) >= 2


def test_decode_attention_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="one query"):
        decode_attention(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8),
                         1.0)
    with pytest.raises(ValueError, match="divide"):
        decode_attention(torch.randn(1, 4, 1, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8),
                         1.0)


def test_attend_uses_it_only_inside_a_blocked_block_for_unmasked_single_queries():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    args = dict(mask=None, is_causal=False, scale=0.3, dropout_p=0.0, need_weights=False)
    sdpa = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    assert torch.equal(attend(q, k, v, **args)[0], sdpa)  # outside: SDPA, bit for bit
    with kattend.use("blocked"):
        assert torch.equal(attend(q, k, v, **args)[0], decode_attention(q, k, v, 0.3))
        mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3,
                                                enable_gqa=True)
        assert torch.equal(attend(q, k, v, **{**args, "mask": mask})[0], masked)


DECODERS = [dict(design=d) for d in DESIGNS] + [dict(n_kv_heads=2), dict(n_kv_heads=1),
                                                dict(design="tied_kv", n_kv_heads=2),
                                                dict(design="tied_kv", positions="rotary")]


@pytest.mark.parametrize("opts", DECODERS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("batch", [1, 3])
def test_generate_on_the_blocked_kernel_matches_the_float64_model(kernel, opts, batch):
    """Every design (and GQA, MQA, tied K=V with GQA) decoding on the pinned blocked kernel: the
    logits of each step agree with the float64 forward over the whole sequence."""
    torch.manual_seed(batch)
    model = build_model(ModelConfig(**TINY, **opts)).eval()
    model64 = copy.deepcopy(model).double()
    idx = torch.randint(0, 37, (batch, 12))
    kernel("blocked")
    with torch.no_grad(), model.decoding(batch, 12):
        caches = model.new_caches(batch)
        steps = [model(idx[:, :3], caches=caches)] + [
            model(idx[:, t:t + 1], caches=caches) for t in range(3, 12)]
    assert_close(torch.cat(steps, 1).double(), model64(idx), rtol=1e-4, atol=1e-5)


def test_kernel_choice_is_measured_per_layer_batch_and_context_or_pinned(kernel, monkeypatch):
    model = build_model(ModelConfig(**TINY)).eval()
    layer = model.blocks[0].attn
    calls = []
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: calls.append(a) or 2.0)
    assert kattend.decode_attention_kernel(layer, 2, 9) == "blocked"
    assert kattend.decode_attention_kernel(layer, 2, 16) == "blocked"  # same power of two
    assert len(calls) == 1 and calls[0][3] == 16
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: 1.0)
    assert kattend.decode_attention_kernel(layer, 4, 9) == "sdpa"
    kernel("blocked")
    assert kattend.decode_attention_kernel(layer, 4, 9) == "blocked"
    with pytest.raises(ValueError, match="not one of"):
        kernel("fast")


def test_probe_is_a_positive_ratio():
    assert kattend.attention_probe(2, 4, 2, 64, 8, shared=False, reps=1) > 0
    assert kattend.attention_probe(1, 4, 4, 64, 8, shared=True, reps=1) > 0
