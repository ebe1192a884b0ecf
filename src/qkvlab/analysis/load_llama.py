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

from pathlib import Path

import numpy as np
import torch

from qkvlab.analysis._capture import capture_inputs
from qkvlab.analysis._files import (
    CheckpointError,
    read_json,
    read_tensors,
    require_file,
    safetensors_files,
    sniff,
    take,
)
from qkvlab.analysis.heads import ModelView, fold_qk_norm, from_linear

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
          role="decoder"):
    # LlamaForCausalLM saves "model.layers…", a bare LlamaModel "layers…"
    anchor = next((k for k in tensors if k.endswith("layers.0.self_attn.q_proj.weight")), None)
    if anchor is None:
        raise CheckpointError(f"{where}: no layers.0.self_attn.q_proj.weight; not a "
                              "Llama-family checkpoint")
    pre = anchor[: -len("layers.0.self_attn.q_proj.weight")]
    layers = []
    for i in range(L):
        a = f"{pre}layers.{i}.self_attn"

        def wb(p, a=a):  # bind this layer's prefix
            return take(tensors, f"{a}.{p}.weight", where), tensors.get(f"{a}.{p}.bias")

        lay = from_linear(i, role, wb("q_proj"), wb("k_proj"), wb("v_proj"), wb("o_proj"),
                          n_heads=H, n_kv_heads=G, name=f"{role}.{i}")
        if f"{a}.q_norm.weight" in tensors:  # Gemma-3: RMSNorm(q)·(1 + w), RMSNorm(k)·(1 + w)
            lay = fold_qk_norm(lay, 1 + take(tensors, f"{a}.q_norm.weight", where),
                               1 + take(tensors, f"{a}.k_norm.weight", where))
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
        CheckpointError: missing/corrupt files or tensors, an unsupported ``model_type``.
    """
    folder = Path(folder)
    cfg = read_json(folder / "config.json")
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        raise CheckpointError(f"{folder}: model_type {mt!r} is not one of {list(MODEL_TYPES)}")
    H, L = int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    G = int(cfg.get("num_key_value_heads") or H)
    role = "encoder" if cfg.get("use_bidirectional_attention") else "decoder"
    files = safetensors_files(folder)
    t = read_tensors(files)
    view = _view(t, files[0], L=L, H=H, G=G, model_type=mt, name=name or folder.name,
                 source=folder, family="gemma3" if mt.startswith("gemma") else "llama", role=role)
    view.meta["init_std"] = cfg.get("initializer_range")

    def capture(texts):
        from transformers import AutoModel, AutoTokenizer  # lazy: optional extra [analysis]

        model = AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
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
        CheckpointError: not GGUF, truncated/corrupt, unsupported arch, missing metadata.
    """
    import gguf  # lazy: optional extra [analysis]

    path = require_file(path)
    if sniff(path) != "gguf":
        raise CheckpointError(f"{path}: not a GGUF file (no 'GGUF' magic)")
    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:  # ValueError/IndexError from reading past the end, bad enums
        raise CheckpointError(f"{path}: corrupt or truncated GGUF file ({e})") from None

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None:
            if default is None:
                raise CheckpointError(f"{path}: GGUF metadata {key!r} missing")
            return default
        return f.contents()

    arch = field("general.architecture")
    if arch not in GGUF_ARCHS:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported; "
                              f"supported: {list(GGUF_ARCHS)}")
    names = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in names:
        raise CheckpointError(f"{path}: GGUF has no token_embd.weight")
    H = int(field(f"{arch}.attention.head_count"))
    cfg = dict(model_type=arch, hidden_size=int(field(f"{arch}.embedding_length")),
               num_attention_heads=H, num_key_value_heads=int(field(f"{arch}.attention.head_count_kv", H)),
               num_hidden_layers=int(field(f"{arch}.block_count")),
               intermediate_size=int(field(f"{arch}.feed_forward_length")),
               rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
               rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
               vocab_size=int(names["token_embd.weight"].shape[-1]),
               tie_word_embeddings="output.weight" not in names,
               file_types=sorted({t.tensor_type.name for t in r.tensors}), path=str(path))
    return r, cfg


def gguf_tensors(reader, cfg: dict, attention_only: bool = False) -> dict[str, torch.Tensor]:
    """HF-named float32 tensors of an open GGUF file, dequantized, Q/K rows de-permuted."""
    import gguf  # lazy: optional extra [analysis]

    arch, sd = cfg["model_type"], {}
    names = GGUF_TO_HF_GEMMA3 if arch == "gemma3" else GGUF_TO_HF
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
        try:
            w = gguf.dequantize(t.data, t.tensor_type)
            w = np.array(w, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        except Exception as e:  # data cut short, unknown quantization
            raise CheckpointError(f"{cfg['path']}: tensor {t.name} ({t.tensor_type.name}) could not be "
                                  f"dequantized ({e})") from None
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
                 name=name or path.stem, source=path, family=cfg["model_type"], notes=notes)
    view.meta.update(quantization=cfg["file_types"], format="gguf")

    def capture(texts):
        tok = gguf_tokenizer(r, path)
        if cfg["model_type"] == "gemma3":  # transformers' own GGUF reader knows Gemma-3's config
            from transformers import AutoModel

            model = AutoModel.from_pretrained(path.parent, gguf_file=path.name,
                                              dtype=torch.float32)
            return _capture(model, tok, texts)
        return _capture(hf_model_from_gguf(cfg, {**gguf_tensors(r, cfg), **sd}), tok, texts)

    view.capture = capture
    return view


def gguf_tokenizer(reader, path: Path):
    """The file's own tokenizer, built by transformers' GGUF converter from the open reader.

    ``AutoTokenizer.from_pretrained(gguf_file=...)`` would parse the whole file again (seconds
    for a 49k-token vocabulary); this hands the fields already read to the same converter, and
    falls back to that call if transformers' internal layout differs.
    """
    try:  # transformers is lazy here and below: optional extra [analysis]
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )

        tdict = {name: reader.fields[f"tokenizer.{key}"].contents()
                 for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                 if f"tokenizer.{key}" in reader.fields}
        arch = reader.fields["general.architecture"].contents()
        backend, _ = convert_gguf_tokenizer(arch, tdict)
        tok = PreTrainedTokenizerFast(tokenizer_object=backend)
        for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
            if key in tdict:
                setattr(tok, name, tdict["tokens"][tdict[key]])
        return tok
    except (ImportError, KeyError, AttributeError, TypeError, ValueError):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


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
    with no_init_weights():  # every weight is overwritten below: skip 135M random draws
        model = cls(hf_cfg)
    body = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")}
    model.load_state_dict(body, strict=True)
    return model.eval()


def _capture(model, tok, texts):
    mods = {f"decoder.{i}": lay.self_attn for i, lay in enumerate(model.layers)}
    return capture_inputs(model, tok, mods, texts)
