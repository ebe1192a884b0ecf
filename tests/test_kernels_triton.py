"""The Triton decode kernel (kernels.triton_decode, FlashDecoding: context splits, then a
combine) equals float64 attention for every cache layout: standard, K=V (one buffer), GQA, MQA,
rotary K=V (pre-rotary cache, keys rotated per tile). Without a GPU it runs under Triton's
interpreter (TRITON_INTERPRET=1) on CPU tensors; where CUDA is available the same tests run the
compiled kernel on the GPU. Skipped where the `triton` extra is not installed."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # read when the kernels are first jitted (lazily, below)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from torch.testing import assert_close  # noqa: E402

from qkvlab.kernels import attend as kattend  # noqa: E402
from qkvlab.kernels import triton_decode  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32 = dict(rtol=1e-5, atol=2e-6)
# name: (kv heads G of 8 query heads, K=V one buffer, rotary keys)
LAYOUTS = {"standard": (8, False, False), "tied_kv": (8, True, False),
           "gqa_half": (4, False, False), "gqa_quarter": (2, False, False),
           "mqa": (1, False, False), "tied_kv_gqa": (2, True, False),
           "rotary_tied_kv": (8, True, True), "rotary_tied_kv_mqa": (1, True, True),
           "rotary_standard": (4, False, True)}


def reference(q, k, v, scale, rope=None):
    """Float64 softmax(scale q keysᵀ) v; keys = k rotated to positions 0..T-1 with ``rope``,
    kv heads repeated per group (h -> h // (H/G))."""
    H, G, T = q.shape[1], k.shape[1], k.shape[2]
    k64 = k.double()
    if rope is not None:
        k64 = kattend.rotate(k64, rope[0][:T].double(), rope[1][:T].double())
    k64, v64 = (t.repeat_interleave(H // G, dim=1) for t in (k64, v.double()))
    return ((q.double() @ k64.mT) * scale).softmax(-1) @ v64


def case(layout, B, T, d, seed=0, dtype=torch.float32, dv=None):
    """q, k, v as the KV cache hands them over (narrow views of a longer buffer, one buffer
    for K=V) and rotate-half tables of random angles for the rotary layouts."""
    G, shared, rotary = LAYOUTS[layout]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 8, 1, d, generator=g) * 3  # peaked softmax: the rescaling matters
    k = torch.randn(B, G, T + 5, d, generator=g).narrow(2, 0, T)
    v = k if shared else torch.randn(B, G, T + 5, dv or d, generator=g).narrow(2, 0, T)
    rope = None
    if rotary:
        ang = torch.rand(T + 5, d // 2, generator=g) * 6
        ang = torch.cat([ang, ang], -1)
        rope = ang.cos().to(DEVICE), ang.sin().to(DEVICE)
    q, k = q.to(DEVICE, dtype), k.to(DEVICE, dtype)
    v = k if shared else v.to(DEVICE, dtype)
    return q, k, v, rope


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("B,T,splits", [(1, 1, None), (2, 150, 3), (3, 40, None)])
def test_triton_decode_equals_float64(layout, B, T, splits):
    """Whole outputs, two-sided: one token, several splits with a ragged last tile (150 tokens
    in tiles of 32, 3 splits), the default split count."""
    q, k, v, rope = case(layout, B, T, 16, seed=T)
    out = triton_decode.decode_attention(q, k, v, 0.25, rope=rope, n_splits=splits, block_t=32)
    assert out.shape == (B, 8, 1, 16) and out.dtype == q.dtype
    assert_close(out.double().cpu(), reference(q, k, v, 0.25, rope).cpu(), **FP32)


@pytest.mark.parametrize("layout", ["standard", "rotary_tied_kv"])
def test_triton_decode_pads_head_widths_that_are_not_powers_of_two(layout):
    """d = 24 (tiles of 32, half 12 in tiles of 16) and, for separate values, d_v = 8."""
    q, k, v, rope = case(layout, 2, 70, 24, dv=None if layout != "standard" else 8)
    out = triton_decode.decode_attention(q, k, v, 0.3, rope=rope, n_splits=2, block_t=16)
    assert_close(out.double().cpu(), reference(q, k, v, 0.3, rope).cpu(), **FP32)


def test_triton_decode_in_half_precision():
    """float16 cache and query (rotary K=V): within half precision of float64."""
    q, k, v, rope = case("rotary_tied_kv", 2, 100, 16, dtype=torch.float16)
    out = triton_decode.decode_attention(q, k, v, 0.25, rope=rope, n_splits=2, block_t=32)
    assert out.dtype == torch.float16
    assert_close(out.double().cpu(), reference(q, k, v, 0.25, rope).cpu(), rtol=2e-2, atol=2e-2)


def test_triton_decode_refuses_what_it_does_not_compute():
    q, k, v, _ = case("standard", 1, 5, 16)
    with pytest.raises(ValueError, match="one query"):
        triton_decode.decode_attention(q.expand(1, 8, 2, 16), k, v, 1.0)
    with pytest.raises(ValueError, match="dtypes"):
        triton_decode.decode_attention(q.double(), k.double(), v.double(), 1.0)


@pytest.mark.parametrize("layout", ["tied_kv", "gqa_half", "mqa", "rotary_tied_kv"])
def test_triton_decode_default_tiles_at_head_width_64(layout):
    """The default tile and split count (``tile``, ``splits``) at a real head width, on both
    products: one and two query heads per group row by row, eight through tl.dot."""
    q, k, v, rope = case(layout, 2, 200, 64, seed=3)
    out = triton_decode.decode_attention(q, k, v, 0.125, rope=rope)
    assert_close(out.double().cpu(), reference(q, k, v, 0.125, rope).cpu(), **FP32)


def test_groups_of_one_or_two_heads_skip_the_padded_dot():
    """tl.dot pads a group to 16 rows; one or two heads take the products row by row, in tiles
    whose (heads, tokens, d) product stays within TILE_ELEMS (at most MAX_TILE tokens)."""
    assert [triton_decode.uses_dot(r) for r in (1, 2, 3, 4, 8, 16)] == [False, False] + [True] * 4
    assert [triton_decode.tile(1, d) for d in (16, 64, 128, 256)] == [64, 32, 16, 8]
    assert [triton_decode.tile(2, d) for d in (16, 64, 128)] == [64, 16, 8]
    assert triton_decode.tile(4, 128) == triton_decode.tile(16, 64) == triton_decode.BLOCK_T


def test_splits_keep_every_split_nonempty():
    assert triton_decode.splits(1, 10, torch.device("cpu"), 32) == 1
    assert triton_decode.splits(1, 1000, torch.device("cpu"), 32) == 16  # 4 per "SM", 4 off GPU
    assert triton_decode.splits(64, 1000, torch.device("cpu"), 32) == 1


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch to Triton happens on CUDA tensors")
@pytest.mark.parametrize("layout", ["tied_kv", "rotary_tied_kv", "mqa"])
def test_decode_attention_on_cuda_runs_triton(layout, monkeypatch):
    q, k, v, rope = case(layout, 2, 300, 64)
    called = []
    monkeypatch.setattr(triton_decode, "decode_attention",
                        lambda *a, _f=triton_decode.decode_attention, **kw:
                        called.append(1) or _f(*a, **kw))
    out = kattend.decode_attention(q, k, v, 0.125, rope=rope)
    assert called
    assert_close(out.double().cpu(), reference(q, k, v, 0.125, rope).cpu(), **FP32)


def test_cpu_decoding_never_imports_triton():
    """Triton installed, a fresh process decodes a rotary K=V model on the CPU kernel and an
    HF model: neither Triton nor the jitted kernels' module is imported."""
    import subprocess
    import sys
    code = """
import sys, torch
from qkvlab.kernels import set_attention_kernel
from qkvlab.models import ModelConfig, build_model
set_attention_kernel("blocked")
cfg = ModelConfig(d_vocab=37, n_ctx=16, d_model=32, n_layers=2, n_heads=4, design="tied_kv",
                  positions="rotary")
build_model(cfg).eval().generate(torch.zeros(1, 2, dtype=torch.long), 3, greedy=True)
import qkvlab.hf.decode
print(sorted(m for m in sys.modules if m == "triton" or m.startswith(("triton.", "qkvlab.kernels.triton_jit"))))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
