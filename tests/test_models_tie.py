"""qkvlab.models.tie: a trained qkvlab decoder tied K = V. Where V already is K·M the fitted
start is the same function (float64, whole logits, two-sided); the other starts keep W_O; the
converted model saves, loads and decodes with one cache tensor per layer."""

import pytest
import torch

from qkvlab import ModelConfig, build_model
from qkvlab.models.tie import moments, tie_kv, tie_kv_layer


def decoder(n_kv=4, bias=False, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_vocab=50, n_ctx=32, d_model=32, n_layers=2, n_heads=4,
                      n_kv_heads=n_kv, bias=bias)
    return build_model(cfg, "decoder").double().eval()


def make_v_a_map_of_k(model, seed=1):
    """Set every layer's W_V (and b_V) to K·M for a random M per kv group: then K = V loses
    nothing and the fitted start must find M."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in model.blocks:
            a = blk.attn
            n, d = a._shape["k"]
            k = a.W_in[a._slices["k"]].view(n, d, -1)
            M = torch.randn(n, d, d, generator=g, dtype=k.dtype) / d ** 0.5
            a.W_in[a._slices["v"]] = (M.transpose(1, 2) @ k).reshape(n * d, -1)
            if a.b_in is not None:
                bk = a.b_in[a._slices["k"]].view(n, d, 1)
                a.b_in[a._slices["v"]] = (M.transpose(1, 2) @ bk).reshape(-1)


@pytest.mark.parametrize("n_kv,bias", [(4, False), (2, True), (1, False)])
def test_the_fitted_start_is_the_same_function_where_v_is_a_map_of_k(n_kv, bias):
    m = decoder(n_kv, bias)
    with torch.no_grad():
        for blk in m.blocks:  # nonzero biases, so the affine fit is exercised
            if blk.attn.b_in is not None:
                blk.attn.b_in.normal_()
    make_v_a_map_of_k(m)
    ids = torch.randint(0, 50, (8, 32), generator=torch.Generator().manual_seed(2))
    tied = tie_kv(m, [ids[:4], ids[4:]], "fitted")
    assert all(b.attn.kv_shared and b.attn.cfg.design == "tied_kv" for b in tied.blocks)
    assert tied.cfg.design == "tied_kv"
    x = torch.randint(0, 50, (3, 32), generator=torch.Generator().manual_seed(3))
    want, got = m(x), tied(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-9 * want.abs().max().item())
    assert not all(b.attn.kv_shared for b in m.blocks)  # the source is untouched


def test_a_generic_model_loses_something_and_the_starts_differ():
    m = decoder()
    ids = torch.randint(0, 50, (8, 32), generator=torch.Generator().manual_seed(2))
    x = ids[:2]
    base = m(x)
    err = {s: (tie_kv(m, [ids], s)(x) - base).abs().max().item()
           for s in ("fitted", "keep_k", "keep_v", "avg")}
    assert all(e > 1e-6 for e in err.values())
    assert err["fitted"] < err["keep_k"]  # the fit's M moves V's information into W_O
    a = m.blocks[0].attn
    for s in ("keep_k", "keep_v", "avg"):  # W_O untouched
        t = tie_kv_layer(a, None, s)
        assert torch.equal(t.out_proj.weight, a.out_proj.weight)
    kv = tie_kv_layer(a, None, "avg").W_K
    assert torch.allclose(kv, (a.W_K + a.W_V) / 2, rtol=0, atol=1e-15)


def test_the_tied_model_saves_loads_and_decodes_with_half_the_cache(tmp_path):
    from qkvlab import load_model, save_model
    m = decoder().float()
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(2))
    tied = tie_kv(m, [ids], "fitted")
    save_model(tied, tmp_path / "t.safetensors")
    back = load_model(tmp_path / "t.safetensors")
    x = ids[:1, :8]
    assert torch.equal(back(x), tied(x))
    cache = back.blocks[0].attn.new_cache(1, 16)
    std = m.blocks[0].attn.new_cache(1, 16)
    assert cache.v is cache.k and std.v is not std.k  # one tensor per layer
    assert cache.nbytes * 2 == std.nbytes
    assert torch.equal(back.generate(x, 4, greedy=True), tied.generate(x, 4, greedy=True))


def test_bad_input_is_one_clear_error():
    m = decoder()
    with pytest.raises(ValueError, match="start: 'mean' is not one of"):
        tie_kv(m, None, "mean")
    with pytest.raises(ValueError, match="needs the layer's input moment"):
        tie_kv_layer(m.blocks[0].attn, None, "fitted")
    with pytest.raises(ValueError, match="no tokens were seen"):
        moments(m, [])
    alt = build_model(ModelConfig(d_vocab=50, n_ctx=32, d_model=32, n_layers=1, n_heads=4,
                                  design="alt"), "decoder")
    with pytest.raises(ValueError, match="only a standard layer"):
        tie_kv(alt, None, "keep_k")


def test_only_a_decoder_lm_is_converted():
    enc = build_model(ModelConfig(d_vocab=50, n_ctx=32, d_model=32, n_layers=1, n_heads=4),
                      "encoder")
    with pytest.raises(ValueError, match="is not a qkvlab decoder LM"):
        tie_kv(enc, None, "keep_k")
