"""Models: peers with copied weights, caches, parameter counts, save/load, folding."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from qkvlab import fold_alt
from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.models import (ModelConfig, build_model, config_params, count_params, from_hf_gpt2,
                           load_model, match_params, save_model)
from reference import reference_attention

TINY = dict(d_vocab=37, n_ctx=24, d_model=32, n_layers=2, n_heads=4)


def test_standard_matches_torch_multihead_attention():
    torch.manual_seed(0)
    D, H = 24, 3
    mha = torch.nn.MultiheadAttention(D, H, bias=True, batch_first=True).double()
    att = build_attention(AttentionConfig(D, H, bias=True)).double()
    with torch.no_grad():
        att.W_in.copy_(mha.in_proj_weight)
        att.b_in.copy_(mha.in_proj_bias)
        att.out_proj.weight.copy_(mha.out_proj.weight)
        att.out_proj.bias.copy_(mha.out_proj.bias)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    src = torch.randn(2, 8, D, dtype=torch.float64)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 6:] = True  # torch MHA: True = ignore; qkvlab: True = keep
    ref, ref_w = mha(x, src, src, key_padding_mask=pad, average_attn_weights=False)
    out, w = att(x, src, key_padding_mask=~pad, need_weights=True)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert_close(w, ref_w, rtol=1e-12, atol=1e-12)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    ref, _ = mha(x, x, x, attn_mask=causal)
    assert_close(att(x, is_causal=True), ref, rtol=1e-12, atol=1e-12)


def test_decoder_matches_hf_gpt2_with_converted_weights():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=61, n_positions=20, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).double().eval()
    ours = from_hf_gpt2(hf).eval()
    idx = torch.randint(0, 61, (3, 20))
    assert_close(ours(idx), hf(idx).logits, rtol=1e-10, atol=1e-10)
    # greedy generation with our KV cache = HF generate
    prompt = idx[:1, :5]
    ref = hf.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 10, greedy=True), ref)


def closed_form(cfg: ModelConfig, design: str, kind: str) -> int:
    """Parameter count from the formulas (not from the modules)."""
    D, H, V, L, M = cfg.d_model, cfg.n_heads, cfg.d_vocab, cfg.n_layers, cfg.d_mlp
    G = cfg.n_kv_heads or H
    dk = cfg.d_head or D // H
    dv = cfg.d_v or dk
    b = int(cfg.bias)
    rows = {"standard": H * dk + G * dk + G * dv, "alt": H * dk + G * dk + G * dv,
            "tied_qk": H * dk + G * dv, "tied_kv": H * dk + G * dk, "tied_qkv": H * dk,
            "uniform": G * dv}[design]
    attn = rows * D + rows * b + H * dv * D + D * b + (H * dv * dv if design == "alt" else 0)
    ln = D + D * b
    mlp = D * M + M * b + M * D + D * b
    block = 2 * ln + attn + mlp
    emb = V * D + cfg.n_ctx * D
    if kind == "encdec":
        return emb + L * block + ln + L * (block + ln + attn) + ln
    return emb + L * block + ln


COUNT_CASES = [(d, e) for d in DESIGNS for e in ({}, dict(bias=False, d_mlp=40), dict(n_kv_heads=2))
               if not (d in ("tied_qk", "tied_qkv") and "n_kv_heads" in e)]  # Q = K: no GQA


@pytest.mark.parametrize("design,extra", COUNT_CASES)
@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_param_counts_match_closed_form(design, kind, extra):
    cfg = ModelConfig(**TINY, design=design, **extra)
    counts = count_params(build_model(cfg, kind))
    assert counts["total"] == closed_form(cfg, design, kind)
    assert counts == config_params(cfg, kind)
    assert counts["embedding"] == cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model


@pytest.mark.parametrize("design", ["tied_qkv", "tied_kv", "tied_qk", "alt"])
def test_match_params_within_one_percent(design):
    base = ModelConfig(**TINY)
    matched = match_params(base.replace(design=design), base)
    n, goal = config_params(matched)["total"], config_params(base)["total"]
    assert abs(n - goal) <= 0.01 * goal
    assert matched.d_model == base.d_model  # widened by d_head: only attention grows


def test_match_params_by_d_model_and_errors():
    base = ModelConfig(**TINY)
    m = match_params(base.replace(design="tied_qkv"), base, by="d_model")
    assert abs(config_params(m)["total"] - config_params(base)["total"]) <= 0.01 * config_params(base)["total"]
    with pytest.raises(ValueError, match="by"):
        match_params(base, base, by="n_layers")


@pytest.mark.parametrize("design", list(DESIGNS))
def test_model_save_load_round_trip(tmp_path, design):
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, design=design, roles={"cross": {"design": "tied_kv"}})
    for kind in ("decoder", "encoder", "encdec"):
        model = build_model(cfg, kind).eval()
        path = save_model(model, tmp_path / f"{kind}.safetensors")
        back = load_model(path).eval()
        assert back.cfg == cfg and type(back) is type(model)
        assert back.lm_head.weight.data_ptr() == back.embed.wte.weight.data_ptr()  # tie kept
        idx = torch.randint(0, 37, (2, 9))
        args = (idx, idx[:, :5]) if kind == "encdec" else (idx,)
        assert_close(back(*args), model(*args), rtol=0, atol=0)


def test_corrupt_and_truncated_checkpoints_raise(tmp_path):
    model = build_model(ModelConfig(**TINY))
    path = save_model(model, tmp_path / "m.safetensors")
    data = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00garbage" * 10)
    for name in ("trunc", "junk", "missing"):
        with pytest.raises(ValueError, match="checkpoint"):
            load_model(tmp_path / f"{name}.safetensors")


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_decoder_cache_and_generation(design, positions):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY, design=design, positions=positions)).double().eval()
    idx = torch.randint(0, 37, (2, 12))
    full = model(idx)
    caches = model.new_caches(2, dtype=torch.float64)
    parts = [model(idx[:, a:b], caches=caches) for a, b in [(0, 5), (5, 6), (6, 12)]]
    assert_close(torch.cat(parts, 1), full, rtol=1e-12, atol=1e-12)
    # greedy generation with the cache = argmax of full forwards, token by token
    out = model.generate(idx[:, :4], 6, greedy=True)
    seq = idx[:, :4]
    for _ in range(6):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(model.generate(idx[:, :4], 5, top_k=5, generator=g1),
                       model.generate(idx[:, :4], 5, top_k=5, generator=g2))


@pytest.mark.parametrize("cross", list(DESIGNS))
def test_encdec_generation_matches_teacher_forcing(cross):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY, roles={"cross": {"design": cross}}), "encdec").double().eval()
    src = torch.randint(3, 37, (2, 9))
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, 7:] = False
    out = model.generate(src, 8, bos_id=1, src_key_padding_mask=pad)
    seq = out[:, :1]
    for _ in range(out.shape[1] - 1):
        nxt = model(src, seq, src_key_padding_mask=pad)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def train_briefly(model, steps=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, model.cfg.d_vocab, (8, 16), generator=g)
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_fold_alt_on_trained_model_is_exact(dtype, tol):
    torch.manual_seed(0)
    alt = train_briefly(build_model(ModelConfig(**TINY, design="alt")).to(dtype)).eval()
    folded = fold_alt(alt).eval()
    assert folded.cfg.attention("decoder").design == "standard"
    assert folded.cfg.attention("decoder").scale == "inside"
    assert count_params(folded)["total"] < count_params(alt)["total"]
    idx = torch.randint(0, 37, (4, 20))
    assert_close(folded(idx), alt(idx), rtol=tol, atol=tol)


def test_fold_outside_scale_keeps_design_and_drops_scale(tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY, design="tied_kv", scale="outside")).double().eval()
    folded = fold_alt(model)
    assert folded.cfg.attention("decoder").scale == "none"
    idx = torch.randint(0, 37, (2, 10))
    assert_close(folded(idx), model(idx), rtol=1e-12, atol=1e-12)
    back = load_model(save_model(folded, tmp_path / "f.safetensors")).double()
    assert_close(back(idx), model(idx), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_encoder_padding_does_not_leak_into_real_tokens(design):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY, design=design), "encoder").double().eval()
    idx = torch.randint(0, 37, (2, 10))
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[:, 7:] = False
    other = idx.clone()
    other[:, 7:] = torch.randint(0, 37, (2, 3))  # change only the padded positions
    a, b = model(idx, pad), model(other, pad)
    assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-13)
    assert_close(model(idx[:, :7]), a[:, :7], rtol=1e-12, atol=1e-12)


def test_attention_dropout_only_in_training():
    torch.manual_seed(0)
    att = build_attention(AttentionConfig(16, 4, dropout=0.5)).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    att.eval()
    assert_close(att(x), reference_attention(att, x), rtol=1e-12, atol=1e-12)  # no dropout
    att.train()
    torch.manual_seed(1)
    a = att(x)
    torch.manual_seed(1)
    assert_close(att(x), a, rtol=0, atol=0)  # seeded: reproducible
    assert (att(x) - a).abs().max() > 1e-3   # but different draws differ
    att.eval()
    assert (att(x) - a).abs().max() > 1e-3


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_mlp_gelu_forms_match_their_float64_formulas(activation):
    from qkvlab.models.blocks import MLP

    torch.manual_seed(0)
    mlp = MLP(ModelConfig(d_vocab=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2,
                          activation=activation)).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    h = x @ mlp.fc.weight.T + mlp.fc.bias
    if activation == "gelu":
        g = 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))
    else:
        g = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    assert_close(mlp(x), g @ mlp.proj.weight.T + mlp.proj.bias, rtol=1e-12, atol=1e-12)


def test_activation_is_checked():
    with pytest.raises(ValueError, match="activation: 'relu' is not one of"):
        ModelConfig(d_vocab=11, n_ctx=8, activation="relu")


@pytest.mark.parametrize("design", ["standard", "alt", "tied_qk", "tied_kv", "tied_qkv"])
def test_fused_projection_and_its_gradient_match_float64_slices(design):
    """The split of the fused GEMM (or the tied designs' slices) gives each role its rows of
    x W_inᵀ + b_in, and W_in's gradient is the sum of the roles' gradients."""
    torch.manual_seed(0)
    att = build_attention(AttentionConfig(d_model=16, n_heads=2, design=design, bias=True)).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    heads = att.project(x)
    w = att.W_in.detach().clone().requires_grad_(True)
    ref = []
    for role in ("q", "k", "v"):
        seg = att.segment_of(role)
        sl, (n, d) = att._slices[seg], att._shape[seg]
        ref.append((x @ w[sl].T + att.b_in[sl].detach()).view(2, 5, n, d).transpose(1, 2))
    for got, want in zip(heads, ref):
        assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = [torch.randn_like(r) for r in ref]
    sum((h * c).sum() for h, c in zip(heads, weights)).backward()
    sum((r * c).sum() for r, c in zip(ref, weights)).backward()
    assert_close(att.W_in.grad, w.grad, rtol=1e-12, atol=1e-12)
