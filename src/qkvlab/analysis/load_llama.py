"""Llama / Mistral / Qwen2 / SmolLM decoders: HF folders (safetensors); GGUF files also Gemma-3.

HF layout per layer ``model.layers.{i}.self_attn``: ``q_proj`` (H·dk, D), ``k_proj`` and
``v_proj`` (G·dk, D) with G = n_kv_heads (GQA), ``o_proj`` (D, H·dv); biases only in Qwen2.

GGUF (llama.cpp): ``blk.{i}.attn_q|attn_k|attn_v|attn_output.weight``, possibly quantized
(Q4_1 …), dequantized with ``gguf.dequantize``. For arch ``llama`` llama.cpp's converter
permutes the rows of W_Q and W_K inside each head, from HF's rotate-half RoPE pairing
(i, i + d/2) to interleaved pairs (2i, 2i + 1); :func:`unpermute` undoes it. The permutation is
the same orthogonal map on the columns of W_Q[h] and W_K[h], so W_QK and every measure here is
unchanged by it, but per-head q/k (and parity with HF) need it undone. llama.cpp's converters
for ``qwen2`` and ``gemma3`` do not permute (those archs use NEOX, i.e. rotate-half, RoPE), so
their rows are read as stored; Qwen2's Q/K/V biases are kept (b_Q, b_K, b_V). Gemma-3 adds a
per-head RMSNorm on q and k, stored by llama.cpp as the gain 1 + w (HF stores w; we subtract
1), whose gains are folded into W_Q and W_K (see :func:`heads.fold_qk_norm`); its softmax
scale is ``query_pre_attn_scalar``^-1/2 = d_head^-1/2 for the 270M model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from qkvlab.analysis._capture import capture_inputs, hf_model
from qkvlab.analysis._files import (as_input_error, check_hf_folder, check_layers, config_int,
                                    count_layers, read_json, read_tensors, require_file,
                                    safetensors_files, sniff, take)
from qkvlab.inputs import InputFileError
from qkvlab.analysis._gguf import check_gguf
from qkvlab.analysis.gguf_tokenizer import gguf_tokenizer  # noqa: F401 (its home was here)
from qkvlab.analysis.heads import ModelView, fold_qk_norm, from_linear
from qkvlab.inputs import bounded_int, check_memory

MODEL_TYPES = ("llama", "mistral", "qwen2", "gemma3_text")
GGUF_ARCHS = ("llama", "qwen2", "gemma3")  # Mistral and SmolLM GGUF files use arch "llama"
# GGUF tensor name (after "blk.{i}.") -> HF name (after "model.layers.{i}.")
GGUF_TO_HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
              "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# Gemma-3 (llama.cpp's Gemma3Model): four norms per block and per-head q/k RMSNorm
GGUF_TO_HF_GEMMA3 = {**GGUF_TO_HF, "attn_q_norm": "self_attn.q_norm",
                     "attn_k_norm": "self_attn.k_norm",
                     "post_attention_norm": "post_attention_layernorm",
                     "ffn_norm": "pre_feedforward_layernorm",
                     "post_ffw_norm": "post_feedforward_layernorm"}
_BLOCK = re.compile(r"^blk\.([0-9]{1,9})\.")
# What every attention layer of a model type holds besides its four projections
ALWAYS = {"qwen2": ("q_proj.bias", "k_proj.bias", "v_proj.bias"),
          "gemma3_text": ("q_norm.weight", "k_norm.weight"),
          "gemma3": ("q_norm.weight", "k_norm.weight")}
GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight",
            "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute``: rows (n·d, D) from interleaved back to HF order."""
    d = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


QK_NORM_NOTE = ("q/k RMSNorm (Gemma-3): each head's q and k are RMS-normalized per token, then "
                "scaled by the norm's gain; the gains are folded into W_Q and W_K, so the scores "
                "are x_i W_Q W_K^T x_j^T divided by per-token positive factors: W_QK is the "
                "content bilinear form up to those factors")


def _view(tensors: dict, where, *, L, H, G, model_type, name, source, family, notes=(),
          role="decoder", layers_key="num_hidden_layers"):
    # LlamaForCausalLM saves "model.layers…", a bare LlamaModel "layers…"
    anchor = next((k for k in tensors if k.endswith("layers.0.self_attn.q_proj.weight")), None)
    if anchor is None:
        raise InputFileError(f"{where}: no layers.0.self_attn.q_proj.weight; not a "
                              "Llama-family checkpoint")
    pre = anchor[: -len("layers.0.self_attn.q_proj.weight")]
    found = count_layers(tensors, lambda i: f"{pre}layers.{i}.self_attn.q_proj.weight")
    check_layers(where, L, found, layers_key)
    layers = []
    need = ALWAYS.get(model_type, ())
    for i in range(L):
        a = f"{pre}layers.{i}.self_attn"
        lacks = [f"{a}.{t}" for t in need if f"{a}.{t}" not in tensors]
        if lacks:  # Llama weights relabelled as Qwen2, say: the model the config names has them
            raise InputFileError(f"{where}: every {model_type} attention layer holds "
                                 f"{', '.join(need)}; layer {i} lacks {', '.join(lacks)}")

        def wb(p, a=a):  # bind this layer's prefix
            return take(tensors, f"{a}.{p}.weight", where, ndim=2), tensors.get(f"{a}.{p}.bias")

        try:
            lay = from_linear(i, role, wb("q_proj"), wb("k_proj"), wb("v_proj"), wb("o_proj"),
                              n_heads=H, n_kv_heads=G, name=f"{role}.{i}")
            if f"{a}.q_norm.weight" in tensors:  # Gemma-3: RMSNorm(q)·(1 + w), RMSNorm(k)·(1 + w)
                g_q = 1 + take(tensors, f"{a}.q_norm.weight", where, ndim=1)
                g_k = 1 + take(tensors, f"{a}.k_norm.weight", where, ndim=1)
                if g_q.shape != (lay.d_head,) or g_k.shape != (lay.d_head,):
                    raise ValueError(f"q/k norm gains of {g_q.numel()} and {g_k.numel()} values "
                                     f"for heads {lay.d_head} wide")
                lay = fold_qk_norm(lay, g_q, g_k)
        except ValueError as e:
            raise as_input_error(where, f"layer {i}", e) from None
        layers.append(lay)
    notes = list(notes)
    if any(k.endswith("q_norm.weight") for k in tensors):
        notes.append(QK_NORM_NOTE)
    return ModelView(name=name, family=family, source=str(source), layers=layers,
                     notes=notes, meta={"model_type": model_type, "n_kv_heads": G})


def load_llama(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Every self-attention layer of an HF Llama-family folder (GQA expanded).

    Causal (role ``decoder``), or bidirectional (role ``encoder``) where the config says
    ``use_bidirectional_attention`` (EmbeddingGemma). Gemma-3's q/k norms are folded in.

    Raises:
        InputFileError: missing/corrupt files or tensors, an unsupported ``model_type``.
    """
    folder = Path(folder)
    where = folder / "config.json"
    cfg = read_json(where)
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        raise InputFileError(f"{folder}: model_type {mt!r} is not one of {list(MODEL_TYPES)}")
    H = config_int(cfg, "num_attention_heads", where, bound="heads")
    L = config_int(cfg, "num_hidden_layers", where, bound="layers")
    G = config_int(cfg, "num_key_value_heads", where, bound="heads", default=H)
    if H % G:
        raise InputFileError(f"{where}: num_key_value_heads {G} does not divide "
                              f"num_attention_heads {H}")
    role = "encoder" if cfg.get("use_bidirectional_attention") else "decoder"
    files = safetensors_files(folder)
    t = read_tensors(files)
    view = _view(t, files[0], L=L, H=H, G=G, model_type=mt, name=name or folder.name,
                 layers_key="num_hidden_layers in config.json",
                 source=folder, family="gemma3" if mt.startswith("gemma") else "llama", role=role)
    D = config_int(cfg, "hidden_size", where, bound="width")
    if view.layers[0].d_model != D:
        raise InputFileError(f"{where}: hidden_size {D}, but the attention weights are "
                              f"{view.layers[0].d_model} wide")
    view.meta["init_std"] = cfg.get("initializer_range")
    stored = sum(x.numel() for x in t.values())

    def capture(texts):
        from transformers import AutoTokenizer  # lazy: optional extra [analysis]

        model = hf_model(folder, stored)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        mods = {f"{role}.{i}": lay.self_attn for i, lay in enumerate(model.layers)}
        return capture_inputs(model.float(), tok, mods, texts)

    view.capture = capture
    return view


# ---- GGUF --------------------------------------------------------------------------------------
def open_gguf(path: str | Path):
    """(reader, config) of a Llama-family GGUF file; config uses HF names.

    ``config``: model_type, hidden_size, num_attention_heads, num_key_value_heads,
    num_hidden_layers, intermediate_size, rms_norm_eps, rope_theta, vocab_size,
    tie_word_embeddings, file_types, path.

    Raises:
        InputFileError: not GGUF, truncated/corrupt, unsupported arch, missing metadata.
    """
    import gguf  # lazy: optional extra [analysis]

    path = require_file(path)
    if sniff(path) != "gguf":
        raise InputFileError(f"{path}: not a GGUF file (no 'GGUF' magic)")
    check_gguf(path)  # every count, length and offset against the file, before the reader
    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:  # the header walk passed: whatever is left is the reader's
        raise InputFileError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None

    def field(key, default=None, kind=int, bound=None):
        f = r.fields.get(key)
        if f is None:
            if default is None:
                raise InputFileError(f"{path}: GGUF metadata {key!r} missing")
            return default
        try:
            value = f.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise InputFileError(f"{path}: GGUF metadata {key!r} is unreadable ({e})") from None
        if kind is int:
            return bounded_int(value, f"GGUF metadata {key!r}", str(path), bound=bound)
        if kind is float:
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value <= 0:
                raise InputFileError(f"{path}: GGUF metadata {key!r} = {value!r} must be a "
                                      "positive number")
            return float(value)
        if not isinstance(value, str):
            raise InputFileError(f"{path}: GGUF metadata {key!r} = {value!r} must be a string")
        return value

    arch = field("general.architecture", kind=str)
    if arch not in GGUF_ARCHS:
        raise InputFileError(f"{path}: GGUF architecture {arch!r} is not supported; "
                              f"supported: {list(GGUF_ARCHS)}")
    names = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in names:
        raise InputFileError(f"{path}: GGUF has no token_embd.weight")
    H = field(f"{arch}.attention.head_count", bound="heads")
    cfg = dict(model_type=arch, hidden_size=field(f"{arch}.embedding_length", bound="width"),
               num_attention_heads=H,
               num_key_value_heads=field(f"{arch}.attention.head_count_kv", H, bound="heads"),
               num_hidden_layers=field(f"{arch}.block_count", bound="layers"),
               intermediate_size=field(f"{arch}.feed_forward_length", bound="width"),
               rms_norm_eps=field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, float),
               rope_theta=field(f"{arch}.rope.freq_base", 10000.0, float),
               vocab_size=int(names["token_embd.weight"].shape[-1]),
               tie_word_embeddings="output.weight" not in names,
               file_types=sorted({t.tensor_type.name for t in r.tensors}), path=str(path))
    _check_gguf_config(path, cfg, names)
    return r, cfg


def _check_gguf_config(path: Path, cfg: dict, names: dict) -> None:
    """The sizes a GGUF file's metadata states against its tensors' shapes (GGUF lists a
    matrix's dimensions innermost first: (in, out))."""
    D, H, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if H % G:
        raise InputFileError(f"{path}: GGUF head_count_kv {G} does not divide head_count {H}")
    bounded_int(cfg["vocab_size"], "the vocabulary (token_embd.weight's rows)", str(path),
                bound="vocab")
    blocks = sorted({int(m.group(1)) for n in names if (m := _BLOCK.match(n))})
    L = cfg["num_hidden_layers"]
    if blocks != list(range(L)):
        held = f"blocks {blocks[0]}-{blocks[-1]} ({len(blocks)})" if blocks else "no blocks"
        raise InputFileError(f"{path}: GGUF block_count = {L}, but the tensors hold {held}")

    def shape(name):
        return [int(d) for d in names[name].shape] if name in names else None

    want = {"token_embd.weight": [D, cfg["vocab_size"]]}
    for i in range(L):
        missing = [f"blk.{i}.{t}.weight" for t in ("attn_q", "attn_k", "attn_v", "attn_output")
                   if f"blk.{i}.{t}.weight" not in names]
        if missing:
            raise InputFileError(f"{path}: block {i} lacks {', '.join(missing)}")
        q, k = shape(f"blk.{i}.attn_q.weight"), shape(f"blk.{i}.attn_k.weight")
        if len(q) != 2 or len(k) != 2:
            raise InputFileError(f"{path}: block {i} has no 2-D attn_q and attn_k weights")
        # llama.cpp permutes Q/K rows in pairs per head (arch llama): rows per head are even
        step = 2 if cfg["model_type"] == "llama" else 1
        if q[1] % (H * step) or k[1] % (G * step) or q[1] // H != k[1] // G:
            raise InputFileError(f"{path}: block {i}: attn_q {q} and attn_k {k} do not split "
                                  f"into {H} and {G} heads of one width")
        d_v = shape(f"blk.{i}.attn_v.weight")[-1] // G
        want.update({f"blk.{i}.attn_q.weight": [D, q[1]], f"blk.{i}.attn_k.weight": [D, k[1]],
                     f"blk.{i}.attn_v.weight": [D, G * d_v],
                     f"blk.{i}.attn_output.weight": [H * d_v, D],
                     f"blk.{i}.ffn_up.weight": [D, cfg["intermediate_size"]],
                     f"blk.{i}.ffn_gate.weight": [D, cfg["intermediate_size"]],
                     f"blk.{i}.ffn_down.weight": [cfg["intermediate_size"], D]})
    for name, dims in want.items():
        got = shape(name)
        if got is not None and got != dims:
            raise InputFileError(f"{path}: tensor {name} has dimensions {got}; the metadata "
                                  f"(embedding_length {D}, feed_forward_length "
                                  f"{cfg['intermediate_size']}, {H}/{G} heads) implies {dims}")


def gguf_tensors(reader, cfg: dict, attention_only: bool = False) -> dict[str, torch.Tensor]:
    """HF-named float32 tensors of an open GGUF file, dequantized, Q/K rows de-permuted."""
    import gguf  # lazy: optional extra [analysis]

    arch, sd = cfg["model_type"], {}
    names = GGUF_TO_HF_GEMMA3 if arch == "gemma3" else GGUF_TO_HF
    chosen = []
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
            hf = f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
        elif t.name in GGUF_TOP:
            hf = GGUF_TOP[t.name]
        else:
            continue
        if attention_only and ".self_attn." not in hf:
            continue
        chosen.append((t, parts, hf))
    # float32 values, plus float64 per-head copies of the attention weights in the view
    per_value = 4 + (16 if attention_only else 0)
    check_memory(cfg["path"], per_value * sum(int(t.n_elements) for t, _, _ in chosen),
                 "dequantizing its tensors")
    for t, parts, hf in chosen:
        try:
            w = gguf.dequantize(t.data, t.tensor_type)
            w = np.array(w, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        except Exception as e:  # data cut short, unknown quantization
            raise InputFileError(f"{cfg['path']}: tensor {t.name} ({t.tensor_type.name}) "
                                  f"could not be dequantized ({e})") from None
        if arch == "llama" and parts[-2] == "attn_q":  # GGUF dims are listed innermost first
            w = unpermute(w, cfg["num_attention_heads"])
        elif arch == "llama" and parts[-2] == "attn_k":
            w = unpermute(w, cfg["num_key_value_heads"])
        elif arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1  # llama.cpp stores Gemma's RMSNorm gain 1 + w; HF stores w
        sd[hf] = torch.from_numpy(w)
    return sd


def read_gguf(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, every HF-named tensor) of a GGUF file; see :func:`open_gguf`."""
    r, cfg = open_gguf(path)
    return cfg, gguf_tensors(r, cfg)


def load_gguf(path: str | Path, *, name: str | None = None) -> ModelView:
    """Every self-attention layer of a Llama-family GGUF file (de-permuted, dequantized)."""
    path = Path(path)
    r, cfg = open_gguf(path)
    sd = gguf_tensors(r, cfg, attention_only=True)  # the MLPs are read only if capture runs
    quant = [k for k in cfg["file_types"] if k not in ("F32", "F16", "BF16", "F64")]
    notes = [f"weights dequantized from {', '.join(quant)}: values carry quantization noise"] \
        if quant else []
    view = _view(sd, path, L=cfg["num_hidden_layers"], H=cfg["num_attention_heads"],
                 G=cfg["num_key_value_heads"], model_type=cfg["model_type"],
                 name=name or path.stem, source=path, family=cfg["model_type"], notes=notes,
                 layers_key="GGUF block_count")
    view.meta.update(quantization=cfg["file_types"], format="gguf")

    def capture(texts):
        tok = gguf_tokenizer(r, path)
        if cfg["model_type"] == "gemma3":  # transformers' own GGUF reader knows Gemma-3's config
            from transformers import AutoModel

            model = AutoModel.from_pretrained(check_hf_folder(path), gguf_file=path.name,
                                              dtype=torch.float32, local_files_only=True,
                                              trust_remote_code=False)
            return _capture(model, tok, texts)
        return _capture(hf_model_from_gguf(cfg, {**gguf_tensors(r, cfg), **sd}), tok, texts)

    view.capture = capture
    return view


def hf_model_from_gguf(cfg: dict, sd: dict[str, torch.Tensor]):
    """transformers' LlamaModel / Qwen2Model holding our converted GGUF weights (strict load)."""
    import transformers  # lazy: optional extra [analysis]
    from transformers.initialization import no_init_weights

    cls, conf = {"llama": (transformers.LlamaModel, transformers.LlamaConfig),
                 "qwen2": (transformers.Qwen2Model, transformers.Qwen2Config)}[cfg["model_type"]]
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
            "intermediate_size", "rms_norm_eps", "vocab_size", "tie_word_embeddings")
    hf_cfg = conf(**{k: cfg[k] for k in keys}, rope_theta=cfg["rope_theta"],
                  attention_bias=any(k.endswith("q_proj.bias") for k in sd))
    body = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")}
    with torch.device("meta"):  # the shapes the config implies, before allocating them
        want = {k: tuple(v.shape) for k, v in cls(hf_cfg).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in body.items()}
    if want != got:
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))[:3]
        raise InputFileError(f"{cfg['path']}: the tensors do not match the model its metadata "
                              f"describes: {[(k, got.get(k), want.get(k)) for k in bad]} "
                              "(name, in the file, implied)")
    with no_init_weights():  # every weight is overwritten below: skip 135M random draws
        model = cls(hf_cfg)
    model.load_state_dict(body, strict=True)
    return model.eval()


def _capture(model, tok, texts):
    mods = {f"decoder.{i}": lay.self_attn for i, lay in enumerate(model.layers)}
    return capture_inputs(model, tok, mods, texts)
