"""qkvlab.hf.tie on tiny random HF decoders (Llama without biases, Qwen2 with Q/K/V biases), float64.

Each tie is checked three ways: the Parameters are literally shared; the tied attention equals a
float64 reference computed from the fitted maps (written out, untied); a model that already has
the tie's structure comes out unchanged. The fits themselves are compared with direct least
squares / the objective on the captured activations.
"""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from qkvlab.hf import KINDS, SharedQuery, TieError, calibrate, tie  # noqa: E402
from qkvlab.hf.tie import _sqrt_pair, fit_kv, fit_qk  # noqa: E402

D_MODEL, N_HEADS, N_KV, D_HEAD = 32, 4, 2, 8


def tiny(family: str = "llama", n_kv: int = N_KV, seed: int = 0):
    torch.manual_seed(seed)
    kw = dict(vocab_size=61, hidden_size=D_MODEL, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=N_HEADS, num_key_value_heads=n_kv, head_dim=D_HEAD,
              max_position_embeddings=64, attn_implementation="sdpa")
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
        for layer in model.model.layers:  # HF initialises biases at zero: make them count
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.data.normal_(0, 0.3)
    return model.double().eval()


def ids(seed: int = 1, batch: int = 3, seq: int = 20) -> torch.Tensor:
    return torch.randint(0, 61, (batch, seq), generator=torch.Generator().manual_seed(seed))


def attn_inputs(model, x_ids):
    """(hidden states entering each layer's attention, cos, sin) of the model on x_ids."""
    got = []
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda m, a, k: got.append((k["hidden_states"], k["position_embeddings"])), with_kwargs=True)
        for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=x_ids)
    for h in hooks:
        h.remove()
    return got


def reference(x, cos, sin, Wq, bq, Wk, bk, Wv, bv, Wo):
    """Float64 causal rotary attention from explicit (untied) maps; Wq rows for every q head."""
    B, T, _ = x.shape
    n_heads, n_kv = Wq.shape[0] // D_HEAD, Wk.shape[0] // D_HEAD

    def heads(W, b, n):
        y = x @ W.T + (b if b is not None else 0)
        return y.view(B, T, n, D_HEAD).transpose(1, 2)  # (B, n, T, d_head)

    def rot(y):
        h = D_HEAD // 2
        return y * cos[:, None] + torch.cat([-y[..., h:], y[..., :h]], -1) * sin[:, None]

    q, k, v = rot(heads(Wq, bq, n_heads)), rot(heads(Wk, bk, n_kv)), heads(Wv, bv, n_kv)
    k, v = (t.repeat_interleave(n_heads // n_kv, 1) for t in (k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(D_HEAD)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
    return out @ Wo.T


def maps(attn):
    """The explicit maps a (possibly tied) HF attention module computes, Q expanded per q head."""
    k, v = attn.k_proj, attn.v_proj
    if isinstance(attn.q_proj, SharedQuery):
        n_rep = attn.q_proj.n_rep
        Wq = k.weight.view(-1, 1, D_HEAD, D_MODEL).expand(-1, n_rep, -1, -1).reshape(-1, D_MODEL)
        bq = None if k.bias is None else k.bias.view(-1, 1, D_HEAD).expand(-1, n_rep, -1).reshape(-1)
    else:
        Wq, bq = attn.q_proj.weight, attn.q_proj.bias
    return (Wq, bq, k.weight, k.bias, v.weight, v.bias, attn.o_proj.weight)


def check_reference(model, x_ids):
    for (x, (cos, sin)), layer in zip(attn_inputs(model, x_ids), model.model.layers):
        with torch.no_grad():
            # sdpa, not eager: eager takes its softmax in float32; with no mask sdpa is causal
            got = layer.self_attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None)[0]
            want = reference(x, cos, sin, *[t.detach() if t is not None else None
                                            for t in maps(layer.self_attn)])
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kind", ["kv", "qk", "qkv"])
def test_tie_shares_parameters_and_matches_reference(family, kind):
    model, x_ids = tiny(family), ids()
    tie(model, kind, calibration=ids(seed=2))
    for layer in model.model.layers:
        a = layer.self_attn
        if kind in ("kv", "qkv"):
            assert a.v_proj.weight is a.k_proj.weight
            assert (a.v_proj.bias is a.k_proj.bias) if family == "qwen2" else a.v_proj.bias is None
        if kind in ("qk", "qkv"):
            assert isinstance(a.q_proj, SharedQuery) and a.q_proj.proj is a.k_proj
    n_unique = len({id(p) for p in model.parameters()})
    assert n_unique == len(list(model.parameters()))  # named once each: shared, not copied
    check_reference(model, x_ids)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_kv_fit_is_least_squares_on_activations(family):
    model, cal_ids = tiny(family), ids(seed=2)
    cal = calibrate(model, cal_ids)
    for (x, _), layer, C in zip(attn_inputs(model, cal_ids), model.model.layers, cal.moments):
        a = layer.self_attn
        X = x.reshape(-1, D_MODEL)
        K = a.k_proj(X).view(len(X), N_KV, D_HEAD).transpose(0, 1)
        V = a.v_proj(X).view(len(X), N_KV, D_HEAD).transpose(0, 1)
        want = torch.linalg.lstsq(K, V).solution
        torch.testing.assert_close(fit_kv(a, C), want.detach(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_kv_exact_when_v_in_span_of_k(family):
    model, x_ids = tiny(family), ids()
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn
            A = torch.randn(N_KV, D_HEAD, D_HEAD, dtype=torch.float64)
            K = a.k_proj.weight.view(N_KV, D_HEAD, D_MODEL)
            a.v_proj.weight.copy_((A.transpose(1, 2) @ K).reshape(-1, D_MODEL))  # v = Aᵀ k per head
            if a.v_proj.bias is not None:
                a.v_proj.bias.copy_((A.transpose(1, 2) @ a.k_proj.bias.view(N_KV, D_HEAD, 1)).reshape(-1))
        before = model(input_ids=x_ids).logits
        tie(model, "kv", calibration=ids(seed=2))
        after = model(input_ids=x_ids).logits
    torch.testing.assert_close(after, before, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_qk_exact_when_q_equals_k_up_to_rotary_gauge(family):
    """Q heads of a group equal K up to one complex scalar per rotary plane (and its inverse on K)."""
    model, x_ids = tiny(family), ids()
    h = D_HEAD // 2
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn
            rows = torch.cat([a.k_proj.weight, a.k_proj.bias[:, None] if a.k_proj.bias is not None
                              else torch.zeros(N_KV * D_HEAD, 1, dtype=torch.float64)], 1)
            c = torch.complex(*rows.view(N_KV, D_HEAD, -1).split(h, 1))        # [g, plane, D]
            alpha = torch.randn(N_KV, h, 1, dtype=torch.complex128) + 1.5
            cq, ck = alpha * c, c / alpha.conj()
            for lin, cc, rep in ((a.q_proj, cq, N_HEADS // N_KV), (a.k_proj, ck, 1)):
                r = torch.cat([cc.real, cc.imag], 1).repeat_interleave(rep, 0).reshape(-1, rows.shape[1])
                lin.weight.copy_(r[:, :-1])
                if lin.bias is not None:
                    lin.bias.copy_(r[:, -1])
        before = model(input_ids=x_ids).logits
        tie(model, "qk", calibration=ids(seed=2))
        after = model(input_ids=x_ids).logits
    torch.testing.assert_close(after, before, rtol=1e-8, atol=1e-8)


def test_qk_fit_minimises_the_whitened_objective():
    """At the fit, the objective is below its value at c_k, at c_q and at small perturbations."""
    model = tiny("llama", n_kv=N_HEADS)  # one q head per kv head: no group averaging
    cal = calibrate(model, ids(seed=2))
    a, C = model.model.layers[0].self_attn, cal.moments[0].clone()
    C[-1, :] = C[:, -1] = 0
    root = _sqrt_pair(C)[0].to(torch.complex128)
    h = D_HEAD // 2

    def planes(W):
        W = torch.cat([W.detach(), torch.zeros(len(W), 1, dtype=W.dtype)], 1).view(N_HEADS, D_HEAD, -1)
        return torch.complex(W[:, :h], W[:, h:])

    cq, ck = planes(a.q_proj.weight), planes(a.k_proj.weight)
    H = cq.conj()[..., :, None] * ck[..., None, :]

    def loss(c):
        G = c.conj()[..., :, None] * c[..., None, :]
        return (root @ (H - G) @ root).abs().square().sum((-1, -2))

    fit = planes(fit_qk(a, cal.moments[0])[:, :-1])
    best = loss(fit)
    for other in (ck, cq, *(fit + 1e-3 * torch.randn_like(fit) for _ in range(5))):
        assert (best <= loss(other) + 1e-12).all()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_gqa_mean_pooling_matches_hand_computation(family):
    model, x_ids = tiny(family), ids()
    old = [tuple(t.detach().clone() if t is not None else None for t in maps(layer.self_attn))
           for layer in model.model.layers]
    tie(model, "gqa", kv_heads=1)
    assert model.config.num_key_value_heads == 1
    for layer, (Wq, bq, Wk, bk, Wv, bv, Wo) in zip(model.model.layers, old):
        a = layer.self_attn
        def mean(t):
            return None if t is None else t.view(N_KV, D_HEAD, -1).mean(0).reshape(D_HEAD, -1).squeeze(-1)
        for lin, W, b in ((a.k_proj, Wk, bk), (a.v_proj, Wv, bv)):
            torch.testing.assert_close(lin.weight.detach(), mean(W), rtol=0, atol=1e-15)
            if b is not None:
                torch.testing.assert_close(lin.bias.detach(), mean(b[:, None]), rtol=0, atol=1e-15)
    check_reference(model, x_ids)


def test_one_layer_leaves_the_others():
    model = tiny()
    before = [p.detach().clone() for p in model.model.layers[0].parameters()]
    tie(model, "kv", calibration=ids(seed=2), layers=[1])
    assert model.model.layers[1].self_attn.v_proj.weight is model.model.layers[1].self_attn.k_proj.weight
    for p, q in zip(model.model.layers[0].parameters(), before):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)


def test_bad_input_says_what_is_wrong():
    model = tiny()
    with pytest.raises(TieError, match="kind: 'vo' is not one of"):
        tie(model, "vo", calibration=ids())
    with pytest.raises(TieError, match="calibration: tie 'kv' is fitted on activations"):
        tie(model, "kv")
    with pytest.raises(TieError, match="calibration: expected a LongTensor"):
        tie(model, "kv", calibration=torch.zeros(3, 4))
    with pytest.raises(TieError, match=r"layers: \[5\] out of range"):
        tie(model, "kv", calibration=ids(), layers=[5])
    with pytest.raises(TieError, match="kv_heads: 3 must divide"):
        tie(model, "gqa", kv_heads=3)
    with pytest.raises(TieError, match="gqa: the model already has a single kv head"):
        tie(tiny(n_kv=1), "gqa")
    tie(model, "kv", calibration=ids())
    with pytest.raises(TieError, match="layer 0 is already tied"):
        tie(model, "qkv", calibration=ids())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(TieError, match="model_type 'gpt2' is not supported"):
        tie(gpt2, "kv", calibration=ids())
    assert KINDS == ("kv", "qk", "qkv", "gqa")


def test_tied_model_trains_on_with_plain_torch_and_saves_with_safetensors(tmp_path):
    """A step of an ordinary optimizer keeps the tie (one Parameter gets both gradients)."""
    from safetensors.torch import load_model, save_model
    model = tie(tiny("qwen2"), "qkv", calibration=ids(seed=2)).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    a = model.model.layers[0].self_attn
    before = a.k_proj.weight.detach().clone()
    model(input_ids=ids(), labels=ids()).loss.backward()
    opt.step()
    assert not torch.equal(a.k_proj.weight, before)
    assert a.v_proj.weight is a.k_proj.weight and a.q_proj.proj is a.k_proj
    save_model(model, str(tmp_path / "tied.safetensors"))
    other = tie(tiny("qwen2", seed=5), "qkv", calibration=ids(seed=3))  # same structure, other values
    load_model(other, str(tmp_path / "tied.safetensors"))
    for p, q in zip(model.parameters(), other.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert other.model.layers[0].self_attn.v_proj.weight is other.model.layers[0].self_attn.k_proj.weight


def test_gemma3_takes_kv_and_refuses_qk():
    """Gemma-3's q/k RMSNorms: K=V still means v = the raw k; Q=K is refused with the reason."""
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(vocab_size=61, hidden_size=D_MODEL, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=N_HEADS,
                                        num_key_value_heads=N_KV, head_dim=D_HEAD, max_position_embeddings=64)
    model = transformers.Gemma3ForCausalLM(cfg).double().eval()
    with pytest.raises(TieError, match="'qk' is not supported for gemma3_text .*RMSNorms"):
        tie(model, "qk", calibration=ids())
    with torch.no_grad():  # V constructed in span(K): the fitted tie changes nothing
        for layer in model.model.layers:
            a = layer.self_attn
            A = torch.randn(N_KV, D_HEAD, D_HEAD, dtype=torch.float64)
            a.v_proj.weight.copy_((A.transpose(1, 2) @ a.k_proj.weight.view(N_KV, D_HEAD, D_MODEL)).reshape(-1, D_MODEL))
        before = model(input_ids=ids()).logits
        tie(model, "kv", calibration=ids(seed=2))
        after = model(input_ids=ids()).logits
    assert model.model.layers[1].self_attn.v_proj.weight is model.model.layers[1].self_attn.k_proj.weight
    torch.testing.assert_close(after, before, rtol=1e-8, atol=1e-8)


def test_fit_residuals_match_direct_computation():
    """kv: the least-squares residual share on the tokens; qk: zero when exact, group >= head."""
    from qkvlab.hf.tie import fit_residuals
    model, cal_ids = tiny("qwen2"), ids(seed=2)
    cal = calibrate(model, cal_ids)
    (x, _), a = attn_inputs(model, cal_ids)[0], model.model.layers[0].self_attn
    X = x.reshape(-1, D_MODEL)
    K = a.k_proj(X).view(len(X), N_KV, D_HEAD).transpose(0, 1).detach()
    V = a.v_proj(X).view(len(X), N_KV, D_HEAD).transpose(0, 1).detach()
    E = K @ torch.linalg.lstsq(K, V).solution - V
    res = fit_residuals(a, cal.moments[0])
    assert math.isclose(res["kv"], (E.square().sum() / V.square().sum()).item(), rel_tol=1e-8)
    assert 0 < res["qk_head"] <= res["qk_group"] < 1
    tie(model, "qk", calibration=cal, layers=[0])  # after the tie Q = K exactly: nothing is left
    res = fit_residuals(a, cal.moments[0])
    assert res["qk_group"] == pytest.approx(0, abs=1e-12) and res["qk_head"] == pytest.approx(0, abs=1e-12)


def test_qk_residual_equals_the_explicit_whitened_forms():
    """fit_residuals' closed form against D×D matrices built by hand (one q head per kv head)."""
    from qkvlab.hf.tie import _nearest_tied, _whitened_qk, fit_residuals
    model = tiny("llama", n_kv=N_HEADS)
    cal = calibrate(model, ids(seed=2))
    a_mod, C = model.model.layers[1].self_attn, cal.moments[1]
    a, b, _ = _whitened_qk(a_mod, C)
    w = _nearest_tied(a, b[:, None])
    H = a[..., :, None] * b[:, None, ..., None, :].conj()          # a bᴴ per head and plane
    G = w[..., :, None] * w[..., None, :].conj()
    want = (H - G).abs().square().sum() / H.abs().square().sum()
    assert math.isclose(fit_residuals(a_mod, C)["qk_head"], want.item(), rel_tol=1e-9)
    # orthogonal a, b leave 3/4 out: the form's symmetric part keeps ±|a||b|/2, the PSD half of it
    e = torch.eye(3, dtype=torch.complex128)
    w = _nearest_tied(e[0], e[1])
    G = w[:, None] * w[None, :].conj()
    H = e[0][:, None] * e[1][None, :]
    assert math.isclose(((H - G).abs().square().sum() / H.abs().square().sum()).item(), 0.75, rel_tol=1e-12)


def test_fitted_value_merge_is_the_best_shared_subspace():
    """fit_values against Eckart–Young computed here: U orthonormal, and the error of the
    group's values through each head's map, in the metric C, is the sum of the smallest
    eigenvalues of V C Vᵀ, the least any shared d_head-dimensional projection allows."""
    from qkvlab.hf.merge import fit_values
    g = torch.Generator().manual_seed(3)
    G, r, d, D = 2, 3, 4, 9
    V = torch.randn(G, r, d, D, generator=g, dtype=torch.float64)
    X = torch.randn(200, D, generator=g, dtype=torch.float64)
    C = X.T @ X / 200
    shared, U = fit_values(V, C)
    for grp in range(G):
        Ug = U[grp].reshape(r * d, d)
        torch.testing.assert_close(Ug.T @ Ug, torch.eye(d, dtype=torch.float64), rtol=0,
                                   atol=1e-12)
        stacked = V[grp].reshape(r * d, D)
        err = sum(((V[grp, j] - U[grp, j] @ shared[grp]) @ X.T).square().sum() / 200
                  for j in range(r))
        small = torch.linalg.eigvalsh(stacked @ C @ stacked.T)[:-d].sum()
        torch.testing.assert_close(err, small, rtol=1e-10, atol=1e-12)


def grouped(family: str):
    """A tiny model whose kv heads 0 and 1 share their keys and one value row space
    (V_1 = A V_0, values without bias): one kv head can hold both exactly."""
    model = tiny(family, n_kv=N_KV)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn
            k, v = a.k_proj.weight.view(N_KV, D_HEAD, -1), a.v_proj.weight.view(N_KV, D_HEAD, -1)
            k[1] = k[0]
            v[1] = torch.randn(D_HEAD, D_HEAD, generator=g, dtype=torch.float64) @ v[0]
            if a.k_proj.bias is not None:
                a.k_proj.bias.view(N_KV, D_HEAD)[1] = a.k_proj.bias.view(N_KV, D_HEAD)[0]
                a.v_proj.bias.zero_()
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fitted_gqa_is_exact_where_the_group_shares_keys_and_a_value_subspace(family):
    """The fitted merge to one kv head keeps every logit of such a model (the values' maps
    folded into W_O: an ordinary GQA model); mean-pooling does not."""
    x_ids = ids(seed=4)
    with torch.no_grad():
        want = grouped(family)(input_ids=x_ids).logits
        fitted = tie(grouped(family), "gqa", calibration=ids(seed=2), kv_heads=1,
                     start="fitted")
        pooled = tie(grouped(family), "gqa", kv_heads=1)
        assert fitted.config.num_key_value_heads == pooled.config.num_key_value_heads == 1
        torch.testing.assert_close(fitted(input_ids=x_ids).logits, want, rtol=1e-9, atol=1e-9)
        assert (pooled(input_ids=x_ids).logits - want).abs().max() > 1e-3
    with pytest.raises(TieError, match="calibration: tie 'gqa' is fitted on activations"):
        tie(grouped(family), "gqa", kv_heads=1, start="fitted")
