"""The one-query decode attention (kernels.attend) equals float64 attention for every cache
layout (separate K and V, one K=V buffer, GQA, MQA), rotary K=V in each of its block paths,
and runs only inside generate's token loop."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from qkvlab.attention import DESIGNS
from qkvlab.attention.core import attend
from qkvlab.kernels import attend as kattend
from qkvlab.kernels import decode_attention, numba_decode, set_attention_kernel
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


@pytest.fixture(params=["numba", "torch"])
def path(request, monkeypatch):
    """Run a test on the Numba kernel (kernels.numba_decode, float32 on the CPU) or on what runs
    where it does not: packed SDPA, and the eager blocks for rotary K=V."""
    if request.param == "torch":
        monkeypatch.setattr(kattend, "_fused_runs", lambda *a: False)
    return request.param


def cache(B, G, T, d, shared, max_len=None):
    """k, v as KVCache hands them over: narrow views of a longer buffer, one buffer if shared."""
    buf = torch.randn(B, G, max_len or T + 3, d)
    k = buf.narrow(2, 0, T)
    return k, k if shared else torch.randn(B, G, max_len or T + 3, d).narrow(2, 0, T)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("B,T", [(1, 1), (1, 37), (3, 200), (2, 1000)])
def test_decode_attention_equals_float64(path, layout, B, T):
    """Whole outputs, two-sided, every layout, on the Numba kernel and on the group's query
    heads packed as the rows of one SDPA call against their kv head (one K=V buffer passed as
    both)."""
    G, shared = LAYOUTS[layout]
    torch.manual_seed(B * T)
    q = torch.randn(B, 8, 1, 16) * 3  # peaked softmax
    k, v = cache(B, G, T, 16, shared)
    assert kattend.shares_storage(k, v) == shared
    out = decode_attention(q, k, v, 0.25)
    assert out.shape == (B, 8, 1, 16)
    assert_close(out.double(), reference(q, k, v, 0.25), **FP32)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packing_reads_each_kv_head_once_and_one_head_groups_are_sdpa_itself(layout,
                                                                             monkeypatch):
    """Without Numba: one SDPA call whose keys and values are the cache's own kv heads (never
    repeated per query head), with the group's H/G query heads as its query rows; where a
    group is one head that call is the step's own SDPA, bit for bit."""
    monkeypatch.setattr(kattend, "_fused_runs", lambda *a: False)
    G, shared = LAYOUTS[layout]
    q, (k, v) = torch.randn(3, 8, 1, 16), cache(3, G, 200, 16, shared)
    calls, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(a[:3]) or sdpa(*a, **kw))
    out = decode_attention(q, k, v, 0.25)
    [(qs, ks, vs)] = calls
    assert qs.shape == (3, G, 8 // G, 16) and ks is k and vs is v
    if G == 8:
        assert torch.equal(out, sdpa(q, k, v, scale=0.25))


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
    """Measured where the kernel differs from SDPA: every float32 CPU layer where Numba
    imports; without it, only a group of several query heads (a layer of one head per group,
    not rotary, takes SDPA unmeasured: the packed kernel is that same call)."""
    monkeypatch.setattr(kattend, "_numba_imports", lambda: False)
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: pytest.fail("measured"))
    for opts in ({}, {"design": "tied_kv"}):
        plain = build_model(ModelConfig(**TINY, **opts)).eval().blocks[0].attn
        assert kattend.decode_attention_kernel(plain, 2, 9) == "sdpa"
    monkeypatch.setattr(kattend, "_numba_imports", lambda: True)
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: 2.0)
    for opts in ({}, {"design": "tied_kv"}):
        plain = build_model(ModelConfig(**TINY, **opts)).eval().blocks[0].attn
        assert kattend.decode_attention_kernel(plain, 2, 9) == "blocked"
    model = build_model(ModelConfig(**TINY, n_kv_heads=2)).eval()
    layer = model.blocks[0].attn
    calls = []
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: calls.append(a) or 2.0)
    assert kattend.decode_attention_kernel(layer, 2, 9) == "blocked"
    assert kattend.decode_attention_kernel(layer, 2, 15) == "blocked"  # same power of two
    assert len(calls) == 1 and calls[0][3] == 8  # rounded down
    assert kattend.decode_attention_kernel(layer, 2, 16) == "blocked"
    assert len(calls) == 2 and calls[1][3] == 16
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: 1.0)
    assert kattend.decode_attention_kernel(layer, 4, 9) == "sdpa"
    kernel("blocked")
    assert kattend.decode_attention_kernel(layer, 4, 9) == "blocked"
    with pytest.raises(ValueError, match="not one of"):
        kernel("fast")


def test_on_cuda_the_triton_kernel_is_measured_against_sdpa_not_assumed(kernel, monkeypatch):
    """A CUDA layer (its weight's device and dtype, as a model on a GPU holds them) is probed
    there, in its own dtype, and keeps SDPA where the Triton kernel does not measure faster;
    where Triton does not import, or the dtype is not one it computes, SDPA unmeasured."""
    import types

    from qkvlab.kernels import triton_decode

    def layer(dtype):
        w = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype)
        cfg = types.SimpleNamespace(n_heads=8, n_kv_heads=8, d_head=64)
        return types.SimpleNamespace(cfg=cfg, W_in=w, kv_shared=True)

    calls = []
    monkeypatch.setattr(triton_decode, "available", lambda: True)
    monkeypatch.setattr(kattend, "attention_probe",
                        lambda *a, **k: calls.append((a, k)) or ratio)
    ratio = 0.8  # Triton slower (the H200's short contexts): SDPA
    one = layer(torch.bfloat16)
    assert kattend.decode_attention_kernel(one, 16, 4096, rotary=True) == "sdpa"
    (args, kw), = calls
    assert args == (16, 8, 8, 4096, 64, True)
    assert kw == {"rotary": True, "device": torch.device("cuda", 0), "dtype": torch.bfloat16}
    ratio = 1.5  # kept per (device, threads, batch, context): a new context is measured again
    assert kattend.decode_attention_kernel(one, 16, 4096, rotary=True) == "sdpa"
    assert kattend.decode_attention_kernel(one, 16, 32768, rotary=True) == "blocked"
    assert len(calls) == 2
    monkeypatch.setattr(kattend, "attention_probe", lambda *a, **k: pytest.fail("measured"))
    assert kattend.decode_attention_kernel(layer(torch.float64), 16, 4096) == "sdpa"
    monkeypatch.setattr(triton_decode, "available", lambda: False)
    assert kattend.decode_attention_kernel(layer(torch.bfloat16), 16, 4096) == "sdpa"


def test_the_probe_times_the_step_in_the_dtype_it_is_given():
    assert kattend.attention_probe(1, 4, 2, 64, 8, shared=False, reps=1,
                                   dtype=torch.bfloat16) > 0


@pytest.mark.parametrize("step,rounds", [(1e-3, kattend.PROBE_MAX_REPS), (0.02, 5), (0.5, 3)])
def test_probe_takes_more_rounds_of_shorter_steps(step, rounds, monkeypatch):
    """Without ``reps`` the probe times each contender once and fits its rounds in about
    PROBE_SECONDS, 3 to PROBE_MAX_REPS: short steps spread most round to round."""
    seen = []
    monkeypatch.setattr(kattend, "seconds", lambda fn, device=None: step)
    monkeypatch.setattr(kattend, "interleaved",
                        lambda fns, reps: seen.append(reps) or {k: 1.0 for k in fns})
    assert kattend.attention_probe(2, 4, 2, 64, 8, shared=False) == 1.0
    assert seen == [rounds]


def test_probe_is_a_positive_ratio():
    assert kattend.attention_probe(2, 4, 2, 64, 8, shared=False, reps=1) > 0
    assert kattend.attention_probe(1, 4, 4, 64, 8, shared=True, reps=1) > 0


def rope_tables(T, d, seed=0):
    """Rotate-half cos/sin tables (T + 3, d) of random angles (the kernel only reads them)."""
    ang = torch.rand(T + 3, d // 2, generator=torch.Generator().manual_seed(seed)) * 6
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotated_reference(q, k, v, scale, cos, sin):
    """Float64: the keys are k rotated to positions 0..T-1 (rotate-half), the values v as they are."""
    T = k.shape[2]
    x1, x2 = k.double().chunk(2, dim=-1)
    keys = k.double() * cos[:T].double() + torch.cat([-x2, x1], -1) * sin[:T].double()
    return reference(q, keys, v, scale)


@pytest.mark.parametrize("layout", ["tied_kv", "tied_kv_gqa", "gqa_half", "standard"])
@pytest.mark.parametrize("B,T", [(1, 1), (1, 39), (3, 200), (2, 1000)])
@pytest.mark.parametrize("block", [0, 1, 2])  # the eager blocks' sizes
def test_rotary_decode_attention_equals_float64(path, layout, B, T, block):
    """rope=(cos, sin): keys rotated as they are read, values unrotated, on the Numba kernel
    and on the eager blocks (whole sequences, a few sequences, token blocks with the online
    softmax)."""
    G, shared = LAYOUTS[layout]
    torch.manual_seed(T)
    q = torch.randn(B, 8, 1, 16) * 3
    k, v = cache(B, G, T, 16, shared)
    cos, sin = rope_tables(T, 16)
    block_bytes = [kattend.BLOCK_BYTES, 4096, 512][block]
    out = decode_attention(q, k, v, 0.25, block_bytes=block_bytes, rope=(cos, sin))
    assert_close(out.double(), rotated_reference(q, k, v, 0.25, cos, sin), **FP32)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rotary", [True, False])
def test_numba_kernel_splits_rows_over_threads_and_values_may_be_narrower(threads, rotary):
    """The Numba kernel's rows (sequence, kv head) split over torch's thread count, one part
    per thread; separate values of another width (dv 8 against dk 16), unrotated."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(threads)
        q = torch.randn(5, 4, 1, 16) * 3
        k, _ = cache(5, 2, 301, 16, False)
        v = torch.randn(5, 2, 310, 8).narrow(2, 0, 301)
        cos, sin = rope_tables(301, 16)
        assert kattend._fused_runs(q, k, v)
        out = decode_attention(q, k, v, 0.25, rope=(cos, sin) if rotary else None)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (5, 4, 1, 8)
    want = (rotated_reference(q, k, v, 0.25, cos, sin) if rotary
            else reference(q, k, v, 0.25))
    assert_close(out.double(), want, **FP32)


def test_numba_kernel_reads_the_cache_in_place_and_only_float32_on_the_cpu():
    """The kernel's view of the cache is the cache's own memory (no copy, no rotated copy);
    any other dtype takes the eager blocks."""
    k, _ = cache(3, 2, 50, 16, True, max_len=64)
    flat, offs, stride = numba_decode._rows(k)
    assert flat.ctypes.data == k.data_ptr() and stride == 16
    assert list(offs) == [(b * 2 + g) * 64 * 16 for b in range(3) for g in range(2)]
    q = torch.randn(3, 4, 1, 16)
    assert kattend._fused_runs(q, k, k)
    assert not kattend._fused_runs(q.bfloat16(), k.bfloat16(), k.bfloat16())
    assert not kattend._fused_runs(q, k.double(), k.double())


def test_numba_kernel_reads_a_kv_cache_given_as_two_views_as_one_cache(monkeypatch):
    """A K=V cache reaches the kernel as two views (``KVCache.keys()`` and ``values()``, each a
    ``narrow``): it runs as one cache, bit for bit what the same tensor passed twice gives,
    reading the rows once (one storage, not two), and equals the float64 reference."""
    torch.manual_seed(0)
    q = torch.randn(3, 4, 1, 16) * 3
    buf = torch.randn(3, 4, 80, 16)
    k = buf.narrow(2, 0, 61)
    read = []
    real = numba_decode._rows
    monkeypatch.setattr(numba_decode, "_rows", lambda x: read.append(x) or real(x))
    same = numba_decode.decode(q, k, k, 0.25)
    views = numba_decode.decode(q, buf.narrow(2, 0, 61), buf.narrow(2, 0, 61), 0.25)
    assert len(read) == 2  # one storage read per call
    assert torch.equal(views, same)
    assert_close(views.double(), reference(q, k, k, 0.25), **FP32)
    apart = numba_decode.decode(q, k, k.clone(), 0.25)  # equal values in other memory
    assert len(read) == 4  # two storages: keys and values read apart
    assert_close(apart.double(), reference(q, k, k, 0.25), **FP32)


def test_numba_kernel_compiles_uncached_where_no_cache_folder_is_writable(monkeypatch):
    """Numba refuses ``cache=True`` at decoration where it finds no writable cache folder (a
    read-only install and no home): the kernel then compiles without a cache, and runs."""
    real = numba_decode.njit

    def njit(**kw):
        if kw.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'x'")
        return real(**kw)

    monkeypatch.setattr(numba_decode, "njit", njit)

    def twice(x):
        return 2 * x

    compiled = numba_decode._jit(twice)
    assert compiled(3.0) == 6.0
    assert type(compiled._cache).__name__ == "NullCache"  # nothing written
    assert type(numba_decode._kernel._cache).__name__ == "FunctionCache"  # here it can cache


def test_numba_kernel_runs_in_a_forked_child_after_the_parent_ran_it():
    """Threads of its own, not Numba's OpenMP layer, which kills a child forked after it ran
    ("fork() called from a process already using GNU OpenMP"): a forked child decodes too."""
    import multiprocessing as mp
    if not hasattr(os, "fork"):  # Windows: no fork, nothing to test
        pytest.skip("no fork on this platform")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, (k, _) = torch.randn(2, 4, 1, 16), cache(2, 2, 100, 16, True)
        rope = rope_tables(100, 16)
        want = decode_attention(q, k, k, 0.25, rope=rope)
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply(_decode_in_child, (q, k.contiguous(), rope))
    finally:
        torch.set_num_threads(before)
    assert_close(got, want, rtol=0, atol=0)


def _decode_in_child(q, k, rope):
    torch.set_num_threads(2)
    return decode_attention(q, k, k, 0.25, rope=rope)


@pytest.mark.parametrize("block_bytes", [4096, 512])
def test_rotary_kv_rotates_blocks_never_the_whole_cache(block_bytes, monkeypatch):
    """On the eager blocks a K=V cache is read once: the keys are rotated a token block at a
    time (across every sequence) into one buffer of at most ``block_bytes``, never the whole
    (B·G, T, d) cache."""
    monkeypatch.setattr(kattend, "_fused_runs", lambda *a: False)
    monkeypatch.setattr(kattend, "rotate", lambda *a: pytest.fail("rotated the whole cache"))
    sizes, mul = [], torch.mul
    monkeypatch.setattr(torch, "mul", lambda *a, out=None: sizes.append(out.nbytes) or
                        mul(*a, out=out))
    k, _ = cache(3, 2, 200, 16, True)
    out = decode_attention(torch.randn(3, 8, 1, 16), k, k, 0.25, block_bytes=block_bytes,
                           rope=rope_tables(200, 16))
    assert out.shape == (3, 8, 1, 16)
    assert len(sizes) > 2 and max(sizes) <= block_bytes // 2  # each half of one block


def test_rope_identity_moves_the_rotation_to_the_key_side():
    """<R_i q, R_j k> = <R_(i-j) q, k> = <q, R_(j-i) k> for the rotate-half rotation (float64
    angles p·base^(-2m/d), as models.Rotary): what lets the kernel keep a pre-rotary cache."""
    inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)

    def rot(x, p):
        ang = torch.cat([p * inv, p * inv])
        return kattend.rotate(x, ang.cos(), ang.sin())

    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    for i, j in [(5, 2), (40, 0), (17, 17), (63, 30), (2, 9)]:
        score = rot(q, i) @ rot(k, j)
        assert_close(score, rot(q, i - j) @ k, rtol=1e-12, atol=1e-12)
        assert_close(score, q @ rot(k, j - i), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batch", [1, 3])
def test_rotary_tied_kv_generate_never_rotates_the_cache(kernel, batch):
    """generate of a rotary tied_kv decoder on the kernel: its rope touches one position per
    step (the query), never the cache, and it picks the tokens the float64 model picks from
    the same prefix (whole logits compared in the blocked-kernel test above)."""
    torch.manual_seed(batch)
    model = build_model(ModelConfig(**TINY, design="tied_kv", positions="rotary")).eval()
    calls, rope = [], model.rope.forward
    model.rope.forward = lambda x, offset: calls.append(x.shape[-2]) or rope(x, offset)
    idx = torch.randint(0, 37, (batch, 4))
    kernel("blocked")
    out = model.generate(idx, 8, greedy=True)
    assert calls[:2 * TINY["n_layers"]] == [4] * 2 * TINY["n_layers"]  # the prompt: q and k
    assert set(calls[2 * TINY["n_layers"]:]) == {1}  # each step: the query alone
    model64 = copy.deepcopy(model).double()
    model64.rope.forward = rope
    with torch.no_grad():
        picked = model64(out[:, :-1]).argmax(-1)[:, 3:]
    assert torch.equal(out[:, 4:], picked)


def test_kernel_choice_probes_rotary_kv_as_rotary(kernel, monkeypatch):
    """A rotary K=V layer is measured with the rotation in both contenders, and kept apart."""
    model = build_model(ModelConfig(**TINY, design="tied_kv", positions="rotary")).eval()
    seen = []
    monkeypatch.setattr(kattend, "attention_probe",
                        lambda *a, **k: seen.append(k.get("rotary")) or 2.0)
    with model.decoding(2, 9):
        pass
    assert seen == [True]
    # without the rotation the same layer is measured apart
    assert kattend.decode_attention_kernel(model.blocks[0].attn, 2, 9) == "blocked"
    assert seen == [True, False]
    assert kattend.attention_probe(1, 4, 2, 64, 8, shared=True, reps=1, rotary=True) > 0


def test_cpu_decode_never_reaches_triton(kernel, monkeypatch):
    """On the CPU the decode kernel never asks for Triton (it is chosen only for CUDA tensors)."""
    from qkvlab.kernels import triton_decode
    for name in ("available", "decode_attention", "_kernels"):
        monkeypatch.setattr(triton_decode, name, lambda *a, **k: pytest.fail("asked for Triton"))
    model = build_model(ModelConfig(**TINY, design="tied_kv", positions="rotary")).eval()
    kernel("auto")
    model.generate(torch.zeros(1, 2, dtype=torch.long), 3, greedy=True)
    kernel("blocked")
    model.generate(torch.zeros(1, 2, dtype=torch.long), 3, greedy=True)
