"""Few-row products (decoding) on the batched kernel: the same function as F.linear, chosen per
model by measurement, and used only inside generate."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from qkvlab.attention import DESIGNS
from qkvlab.kernels import Linear, decode_kernel, gemv, linear, set_gemv_kernel
from qkvlab.models import ModelConfig, build_model

TINY = dict(d_vocab=37, n_ctx=24, d_model=32, n_layers=2, n_heads=4)
FP32 = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture
def kernel(monkeypatch):
    """Pin the few-row kernel for one test; the process's setting is restored afterwards."""
    monkeypatch.setattr(gemv.CHOICE, "pinned", gemv.CHOICE.pinned)
    return set_gemv_kernel


def ref(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("out", [24, 18, 7])  # splits in 4 blocks, in 2, in none (F.linear)
@pytest.mark.parametrize("shape", [(1, 16), (3, 16), (2, 1, 16), (1, 8, 16), (0, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_batched_few_rows_equal_float64_linear(out, shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out, 16, generator=g)
    b = torch.randn(out, generator=g) if bias else None
    with torch.no_grad(), gemv.use("batched"):
        y = linear(x, w, b)
    assert y.shape == (*shape[:-1], out) and y.dtype == torch.float32
    assert y.is_contiguous()  # as F.linear's: SDPA runs its unfused path on a strided query
    assert_close(y.double(), ref(x, w, b), **FP32)


def test_batched_form_takes_the_weight_in_row_blocks():
    # the path itself, not the dispatch: a 4-block split of a non-trivial product
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(1, 1, 40, generator=g), torch.randn(64, 40, generator=g), torch.randn(64, generator=g)
    assert_close(gemv._batched(x, w, b).double(), ref(x, w, b), **FP32)
    wt = torch.randn(40, 64, generator=g).t()  # not contiguous: F.linear, bit for bit
    assert torch.equal(gemv._batched(x, wt, b), F.linear(x, wt, b))


def test_a_batch_step_on_the_batched_kernel_keeps_sdpa_on_its_fused_path(kernel, monkeypatch):
    # four rows through the batched form once gave the query a strided last dimension, and SDPA
    # on the CPU then ran its unfused math path: 3-5x slower decode steps at batch 4
    from torch.profiler import ProfilerActivity, profile

    from qkvlab.kernels import attend, set_attention_kernel
    monkeypatch.setattr(attend.CHOICE, "pinned", attend.CHOICE.pinned)  # restored afterwards
    kernel("batched")
    set_attention_kernel("sdpa")
    model = build_model(ModelConfig(**TINY)).eval()
    caches = model.new_caches(4, 8)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof, model.decoding(4, 8):
        model(torch.zeros(4, 1, dtype=torch.long), caches=caches)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


def test_everything_else_is_f_linear_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    few, many = torch.randn(2, 16, generator=g), torch.randn(gemv.FEW_ROWS + 1, 16, generator=g)
    with gemv.use("batched"):
        assert torch.equal(linear(few, w, b), F.linear(few, w, b))  # grad mode on: training
        with torch.no_grad():
            assert torch.equal(linear(many, w, b), F.linear(many, w, b))  # a whole batch
            xd, wd, bd = few.double(), w.double(), b.double()
            assert torch.equal(linear(xd, wd, bd), F.linear(xd, wd, bd))  # not fp32
    with torch.no_grad():  # outside generate's block: evaluation, analysis
        assert torch.equal(linear(few, w, b), F.linear(few, w, b))
        with gemv.use("linear"):
            assert torch.equal(linear(few, w, b), F.linear(few, w, b))
    with pytest.raises(ValueError, match="gemv kernel: 'auto' is not one of"):
        with gemv.use("auto"):
            pass
    assert gemv.CHOICE.active == "linear"  # restored after the blocks


def test_linear_gradients_are_f_linear_gradients():
    g = torch.Generator().manual_seed(3)
    lin = Linear(16, 24)
    x = torch.randn(1, 16, generator=g)
    with gemv.use("batched"):
        lin(x).square().sum().backward()
    ref_lin = copy.deepcopy(lin)
    ref_lin.zero_grad()
    F.linear(x, ref_lin.weight, ref_lin.bias).square().sum().backward()
    assert torch.equal(lin.weight.grad, ref_lin.weight.grad)
    assert torch.equal(lin.bias.grad, ref_lin.bias.grad)


def test_linear_module_is_an_nn_linear():
    lin = Linear(16, 24, bias=False)
    assert isinstance(lin, torch.nn.Linear)
    assert list(lin.state_dict()) == list(torch.nn.Linear(16, 24, bias=False).state_dict())


@pytest.mark.parametrize("design", list(DESIGNS))
def test_fp32_decoding_on_the_batched_kernel_matches_the_float64_model(kernel, design):
    """The KV-cache decode path, one token at a time in fp32 on the batched kernel, against the
    same weights' float64 forward over the whole sequence."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY, design=design)).eval()
    model64 = copy.deepcopy(model).double()
    idx = torch.randint(0, 37, (1, 10))
    with torch.no_grad(), gemv.use("batched"):
        caches = model.new_caches(1)
        steps = [model(idx[:, :3], caches=caches)] + [
            model(idx[:, t:t + 1], caches=caches) for t in range(3, 10)]
        full64 = model64(idx)
    assert_close(torch.cat(steps, 1).double(), full64, rtol=1e-4, atol=1e-5)


def test_generate_on_either_kernel_matches_the_float64_model(kernel):
    """generate() runs its token loop on the pinned kernel; every logit it chose from agrees
    with the float64 forward, so the tokens are the float64 model's argmax (no near-ties here)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY)).eval()
    model64 = copy.deepcopy(model).double()
    prompt = torch.randint(0, 37, (2, 4))
    seq = prompt
    for _ in range(8):
        seq = torch.cat([seq, model64(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    for kind in ("batched", "linear"):
        kernel(kind)
        assert torch.equal(model.generate(prompt, 8, greedy=True), seq)


def test_encdec_generate_on_either_kernel_matches_the_float64_model(kernel):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY), "encdec").eval()
    model64 = copy.deepcopy(model).double()
    src = torch.randint(3, 37, (2, 9))
    seq = torch.ones(2, 1, dtype=torch.long)
    for _ in range(8):
        seq = torch.cat([seq, model64(src, seq)[:, -1].argmax(-1, keepdim=True)], 1)
    for kind in ("batched", "linear"):
        kernel(kind)
        assert torch.equal(model.generate(src, 8, bos_id=1), seq)


def test_kernel_choice_is_measured_per_model_and_row_count_or_pinned(kernel, monkeypatch):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY)).eval()
    kernel("auto")
    calls = []
    monkeypatch.setattr(gemv, "gemv_probe", lambda mats, reps=5, rows=1:
                        calls.append((len(mats), rows)) or (1.5 if rows == 1 else 0.3))
    assert decode_kernel(model) == "batched" and decode_kernel(model) == "batched"
    assert calls == [(len(gemv.matrices(model)), 1)]  # measured once, on the model's matrices
    # a step of four sequences is measured with four rows, apart from one (the batched form
    # can win at one row and lose at four)
    assert decode_kernel(model, rows=4) == "linear" and decode_kernel(model, rows=4) == "linear"
    assert calls[1:] == [(len(gemv.matrices(model)), 4)]
    assert decode_kernel(model, rows=gemv.FEW_ROWS + 1) == "linear"  # never batched: unmeasured
    assert len(calls) == 2
    other = build_model(ModelConfig(**TINY)).eval()
    monkeypatch.setattr(gemv, "gemv_probe", lambda mats, reps=5, rows=1: 1.1)  # < FASTER_RATIO
    assert decode_kernel(other) == "linear"
    assert decode_kernel(copy.deepcopy(model).double()) == "linear"  # fp64: never measured
    kernel("linear")
    assert decode_kernel(model) == "linear"
    with pytest.raises(ValueError, match=r"gemv kernel: 'fast' is not one of \['auto', 'linear', 'batched'\]"):
        set_gemv_kernel("fast")


def test_matrices_are_every_projection_once():
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY)).eval()
    mats = gemv.matrices(model)
    # per layer W_in, out_proj, fc, proj; then the (tied) unembedding
    assert len(mats) == 4 * TINY["n_layers"] + 1
    assert sum(w is model.lm_head.weight for w, _ in mats) == 1


def test_probe_is_a_positive_ratio_and_checks_its_arguments():
    torch.manual_seed(0)
    mats = gemv.matrices(build_model(ModelConfig(**TINY)))
    assert 0 < gemv.gemv_probe(mats, reps=1) < float("inf")
    assert 0 < gemv.gemv_probe(mats, reps=1, rows=4) < float("inf")
    with pytest.raises(ValueError, match="reps=0"):
        gemv.gemv_probe(mats, reps=0)
    with pytest.raises(ValueError, match=r"non-empty \(got 0\)"):
        gemv.gemv_probe([])
