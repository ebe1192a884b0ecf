"""qkvlab.hf.decode.generate on tiny random HF decoders tied K=V with qkvlab.hf.tie: the same
greedy tokens as HF's own generate(), the same logits as HF's forward in float64, and one cache
tensor (the pre-rotary k) for each K=V layer, so half the cache bytes of the untied model."""

import copy

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from qkvlab.hf import decode as hf_decode  # noqa: E402
from qkvlab.hf.decode import generate  # noqa: E402
from qkvlab.hf.tie import tie  # noqa: E402

VOCAB, NEW = 64, 10


def tiny(family="llama", seed=0):
    """2 layers, 4 heads, 2 kv heads, head_dim 16, vocab 64; no special tokens (no early stop)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, attn_implementation="sdpa")
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()
    for layer in model.model.layers:  # HF initialises biases at zero: make them count
        for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            p.bias.data.normal_(0, 0.3)
    return model


def ids(seed, batch=2, seq=7):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def tied(model, layers=None):
    return tie(copy.deepcopy(model), "kv", calibration=ids(1, batch=4, seq=32), layers=layers)


def hf_generate(model, prompt):
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt),
                              max_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tied_kv_decodes_hf_greedy_tokens_with_half_the_cache(family):
    base = tiny(family)
    model = tied(base)
    assert all(hf_decode.kv_tied(layer.self_attn) for layer in model.model.layers)
    prompt = ids(2)
    got, untied = generate(model, prompt, NEW), generate(base, prompt, NEW)
    assert torch.equal(got.tokens, hf_generate(model, prompt))
    assert torch.equal(untied.tokens, hf_generate(base, prompt))
    assert got.shared == [True, True] and untied.shared == [False, False]
    assert [2 * b for b in got.cache_bytes] == untied.cache_bytes
    # B x G x (T + NEW) x d float32, once for K=V: the measured storage is the cache itself
    assert got.cache_bytes == [2 * 2 * (7 + NEW) * 16 * 4] * 2


@pytest.mark.parametrize("family,layers", [("llama", None), ("llama", [1]), ("qwen2", None)])
def test_logits_equal_hf_forward_in_float64(family, layers):
    """Every step's logits against HF's forward over the decoded sequence, float64, two-sided;
    a partly tied model keeps one tensor in its K=V layer and two in the other."""
    model = tied(tiny(family), layers).double()
    prompt = ids(3, batch=3, seq=5)
    got = generate(model, prompt, NEW)
    with torch.no_grad():
        ref = model(got.tokens).logits[:, 4:-1]
    assert_close(got.logits, ref)
    assert got.shared == ([True, True] if layers is None else [False, True])
    if layers is not None:
        assert got.cache_bytes[0] == 2 * got.cache_bytes[1]


def test_kv_layers_attend_on_their_pre_rotary_cache(monkeypatch):
    """A K=V step hands the kernel one buffer as keys and values with the rotary tables (keys
    rotated as they are read); an untied step hands it rotated k and v, no tables."""
    model = tied(tiny(), layers=[0])
    calls, kernel = [], hf_decode.decode_attention

    def record(q, k, v, scale, rope=None):
        calls.append((k.data_ptr() == v.data_ptr(), rope is not None))
        return kernel(q, k, v, scale, rope=rope)

    monkeypatch.setattr(hf_decode, "decode_attention", record)
    generate(model, ids(4), 3)
    assert calls == [(True, True), (False, False)] * 2  # 2 one-token steps x 2 layers


def test_sampling_and_zero_tokens():
    model = tied(tiny())
    g = torch.Generator().manual_seed(0)
    out = generate(model, ids(5), 4, greedy=False, temperature=0.7, top_k=5, generator=g)
    assert out.tokens.shape == (2, 11) and out.logits.shape == (2, 4, VOCAB)
    none = generate(model, ids(5), 0)
    assert torch.equal(none.tokens, ids(5)) and none.logits.shape == (2, 0, VOCAB)


def test_refuses_what_it_does_not_reproduce():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=32)).eval()
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        generate(gpt2, ids(6), 2)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8)).eval()
    generate(mistral, ids(6, seq=4), 4)  # inside the window
    with pytest.raises(ValueError, match="sliding window 8"):
        generate(mistral, ids(6, seq=4), 5)
    with pytest.raises(ValueError, match="input_ids"):
        generate(mistral, ids(6).float(), 2)
