"""Zoo loaders against a reference implementation on real activations (slow; needs the files).

Each test runs the model's reference (transformers' own classes, which read the same
safetensors folder or dequantize the same GGUF file themselves; onnxruntime for the ONNX
graph) on real text (KJV verses), records the input x of one attention block and the q/k/v
it computes, and checks that the view's per-head ``x @ W + b`` reproduces them, every layer,
whole tensors. A model that is not fetched is skipped, naming ``qkvlab zoo fetch NAME``.

Gemma-3 normalizes q and k per head (RMSNorm) before the scores and the view folds the norm's
gain into W_Q/W_K (:func:`heads.fold_qk_norm`): there q and k are compared as directions
per token and head, which is exactly what the folded view claims; v is compared as is.

No reference: the Marian models (no Marian runtime here; see ``load_marian``).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from qkvlab.analysis import zoo

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def fetched(name: str):
    m = zoo.get(name)
    found = zoo.locate(m)
    if found is None:
        pytest.skip(f"{name} is not fetched: run `qkvlab zoo fetch {name}`")
    return found[0] / m.entry


def texts(n: int = 4) -> list[str]:
    from qkvlab.analysis._capture import real_text

    try:
        return real_text(n)
    except FileNotFoundError as e:
        pytest.skip(f"no real text: {e}")


def heads_of(y: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, n·d) or (B, n, T, d) -> (n, B·T, d)."""
    if y.dim() == 4:  # (B, n, T, d)
        return y.transpose(0, 1).reshape(n, -1, y.shape[-1])
    B, T, _ = y.shape
    return y.reshape(B * T, n, -1).transpose(0, 1)


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4) -> None:
    want = want.to(torch.float64)
    assert_close(got, want, rtol=rtol, atol=rtol * want.abs().max().item())


def direction(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def run_hf(model, tok, attn_mods: list, names: dict[str, str], sents: list[str]):
    """x (input of each attention module) and the outputs of its submodules ``names``
    (role -> attribute path), padding dropped: {i: {"x": (N, D), role: (·)}}."""
    rec: dict[int, dict] = {}
    hooks = []
    for i, att in enumerate(attn_mods):
        rec[i] = {}
        hooks.append(att.register_forward_pre_hook(
            lambda _m, a, kw, i=i: rec[i].__setitem__("x", a[0] if a else kw["hidden_states"]),
            with_kwargs=True))
        for role, path in names.items():
            mod = att
            for p in path.split("."):
                mod = getattr(mod, p)
            hooks.append(mod.register_forward_hook(
                lambda _m, _a, out, i=i, role=role: rec[i].__setitem__(role, out)))
    if tok.pad_token is None:  # decoders ship without one; padded positions are dropped
        tok.pad_token = tok.eos_token
    enc = tok(sents, return_tensors="pt", padding=True, truncation=True, max_length=32)
    try:
        with torch.no_grad():
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    finally:
        for h in hooks:
            h.remove()
    return rec, enc["attention_mask"].bool()


def check_layers(view, rec, keep, *, qk_norm=False):
    for i, lay in enumerate(view.layers):
        r = rec[i]
        x = r["x"][keep].to(torch.float64)  # (N, D)
        H, G = lay.n_heads, lay.n_kv_heads
        for role in "qkv":
            want = r[role]
            if want.dim() == 4:  # (B, n, T, d) after the head split: drop padding per head
                want = want.transpose(1, 2)[keep].transpose(0, 1)  # (n, N, d)
            else:
                want = heads_of(want[keep][None], want.shape[-1] // lay.d_head)
            if role != "q":
                want = want.repeat_interleave(H // G, 0)
            got = lay.project(x, role)
            if qk_norm and role in "qk":
                close(direction(got), direction(want.to(torch.float64)))
            else:
                close(got, want)


# ---- safetensors folders ----------------------------------------------------------------------
@pytest.mark.parametrize("name, family, attn, names", [
    ("sre-embedding", "bert", lambda lay: lay.attention.self,
     {"q": "query", "k": "key", "v": "value"}),
    ("mpnet", "mpnet", lambda lay: lay.attention.attn, {"q": "q", "k": "k", "v": "v"}),
])
def test_safetensors_encoder_matches_transformers(name, family, attn, names):
    folder = fetched(name)
    from qkvlab.analysis.sources import resolve

    view = resolve(name)
    if family == "mpnet":
        assert view.family == "mpnet" and any("relative position bias" in n for n in view.notes)
    hf = transformers.AutoModel.from_pretrained(folder, local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    rec, keep = run_hf(hf, tok, [attn(lay) for lay in hf.encoder.layer], names, texts())
    check_layers(view, rec, keep)


def test_embeddinggemma_matches_transformers_gemma3_with_qk_norm():
    folder = fetched("embeddinggemma")
    from qkvlab.analysis.sources import resolve

    view = resolve("embeddinggemma")
    assert {lay.role for lay in view.layers} == {"encoder"} and view.layers[0].n_kv_heads == 1
    hf = transformers.AutoModel.from_pretrained(folder, local_files_only=True).float().eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    rec, keep = run_hf(hf, tok, [lay.self_attn for lay in hf.layers],
                       {"q": "q_norm", "k": "k_norm", "v": "v_proj"}, texts())
    check_layers(view, rec, keep, qk_norm=True)


# ---- GGUF: transformers dequantizes the same file itself ------------------------------------------
@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_gguf_zoo_model_matches_transformers_gguf_reader(name):
    path = fetched(name)
    from qkvlab.analysis.load_llama import gguf_tokenizer, load_gguf, open_gguf

    view = load_gguf(path)
    hf = transformers.AutoModel.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()
    tok = gguf_tokenizer(open_gguf(path)[0], path)
    gemma = name.startswith("gemma")
    names = {"q": "q_norm", "k": "k_norm", "v": "v_proj"} if gemma else \
        {"q": "q_proj", "k": "k_proj", "v": "v_proj"}
    rec, keep = run_hf(hf, tok, [lay.self_attn for lay in hf.layers], names, texts())
    check_layers(view, rec, keep, qk_norm=gemma)
    if not gemma:
        assert view.layers[0].b_Q is not None and view.layers[0].b_K is not None  # Qwen biases


# ---- CTranslate2 Whisper base (joined parts) -------------------------------------------------------
def test_whisper_base_encoder_matches_transformers_whisper_encoder():
    """No audio ships offline: the input is a fixed random log-mel-like array."""
    path = fetched("whisper-base")
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from qkvlab.analysis.load_whisper import ct2_to_hf_encoder, load_ct2_whisper

    view = [lay for lay in load_ct2_whisper(path).layers if lay.role == "encoder"]
    assert len(view) == 6 and view[0].n_heads == 8
    kw, sd = ct2_to_hf_encoder(path)
    enc = WhisperEncoder(transformers.WhisperConfig(**kw)).double().eval()
    enc.load_state_dict({k: v.double() for k, v in sd.items()}, strict=True)
    g = torch.Generator().manual_seed(0)
    mel = torch.randn(1, kw["num_mel_bins"], 2 * kw["max_source_positions"], generator=g,
                      dtype=torch.float64)
    rec: dict = {}
    hooks = []
    for i, lay in enumerate(enc.layers):
        a = lay.self_attn
        hooks.append(a.q_proj.register_forward_pre_hook(
            lambda _m, args, i=i: rec.setdefault(i, {}).__setitem__("x", args[0])))
        for r in "qkv":
            hooks.append(getattr(a, f"{r}_proj").register_forward_hook(
                lambda _m, _a, out, i=i, r=r: rec.setdefault(i, {}).__setitem__(r, out)))
    with torch.no_grad():
        enc(mel)
    for h in hooks:
        h.remove()
    for i, lay in enumerate(view):
        x = rec[i]["x"].reshape(-1, lay.d_model)
        for r in "qkv":
            assert_close(lay.project(x, r), heads_of(rec[i][r], lay.n_heads), rtol=1e-10,
                         atol=1e-10)


# ---- ONNX DINOv2: onnxruntime runs the same graph ---------------------------------------------------
def test_dinov2_onnx_matches_onnxruntime():
    """No images ship offline: the input is a fixed random image (real weights, real graph)."""
    path = fetched("dinov2-s")
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    import numpy as np

    from qkvlab.analysis.load_onnx import load_onnx_vit

    view = load_onnx_vit(path)
    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    wanted = {}
    for node in model.graph.node:  # Add(bias, MatMul(x, W)) of query/key/value, and that x
        b = next((i for i in node.input if i.endswith(("query.bias", "key.bias", "value.bias"))
                  and "attention.attention" in i), None)
        if node.op_type == "Add" and b is not None:
            layer = int(b.split("encoder.layer.")[1].split(".")[0])
            mm = producer[next(i for i in node.input if i != b)]
            wanted[(layer, b.split(".")[-2][0])] = node.output[0]
            wanted[(layer, "x")] = mm.input[0]
    for name in set(wanted.values()):
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, 1, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    img = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    names = sorted(set(wanted.values()))
    out = dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: img})))
    for lay in view.layers:
        x = torch.from_numpy(out[wanted[(lay.layer, "x")]]).reshape(-1, lay.d_model).double()
        for r in "qkv":
            want = torch.from_numpy(out[wanted[(lay.layer, r)]])
            close(lay.project(x, r), heads_of(want, lay.n_heads))
