"""The fuzz test's seeds, one small valid input per format, and each format's header fields.

Binary formats are rewritten through the writers of :mod:`fuzz_formats`, which take every header
field as an argument; safetensors headers and JSON documents are rewritten field by field.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fuzz_hostile
import numpy as np
from fuzz_formats import (
    ct2_bytes,
    ct2_vars,
    gguf_bytes,
    gguf_lm_seed,
    gguf_seed,
    marian_bytes,
    marian_items,
    onnx_bytes,
)


# ---- JSON documents: every field (to depth 2) set to each value ----------------------------
def json_fields(raw: bytes, values: list, prefix: str = "f") -> list[tuple[str, bytes]]:
    doc = json.loads(raw)
    out = [(f"{prefix}:doc={json.dumps(v)[:12]}", json.dumps(v).encode()) for v in ([], 7, "x")]
    if not isinstance(doc, dict):
        return out
    paths = [(k,) for k in doc] + [(k, j) for k, v in doc.items() if isinstance(v, dict)
                                   for j in list(v)[:12]]
    for path in paths:
        for v in values:
            d = json.loads(raw)
            node = d
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = v
            out.append((f"{prefix}:{'.'.join(path)}={json.dumps(v)[:12]}", json.dumps(d).encode()))
    return out


# ---- safetensors: the header's length, its tensors' entries and its metadata ----------------
def safetensors_fields(raw: bytes, ints: list, wrong: list) -> list[tuple[str, bytes]]:
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]

    def pack(h) -> bytes:
        b = json.dumps(h).encode()
        b += b" " * (-len(b) % 8)
        return len(b).to_bytes(8, "little") + b + data

    out = [(f"st:len={v}", (v % 2**64).to_bytes(8, "little") + raw[8:])
           for v in (0, 1, 2**63 - 1, n - 1, n + 8, len(raw))]
    names = [k for k in header if k != "__metadata__"][:2]
    bad = {"dtype": ["I8", "BOOL", "F8_E4M3", "X", 3],
           "shape": [[0], [-1], [2**40], [10**9, 10**9], "x", [], [1] * 20],
           "data_offsets": [[0, 2**62], [-1, 8], [8, 0], [0, 2**64], "x"]}
    for name in names:
        for field, values in bad.items():
            for v in values:
                h = json.loads(json.dumps(header))
                h[name][field] = v
                out.append((f"st:{name[-12:]}.{field}={json.dumps(v)[:12]}", pack(h)))
    meta = header.get("__metadata__", {})
    for key, text in meta.items():
        for v in ("", "x", "null", "[]"):
            h = json.loads(json.dumps(header))
            h["__metadata__"][key] = v
            out.append((f"st:meta.{key}={v}", pack(h)))
        try:
            json.loads(text)
        except ValueError:  # plain text (the digest): the values above are its mutations
            continue
        for tag, b in json_fields(text.encode(), ints + wrong, prefix=f"st:{key}")[3:]:
            h = json.loads(json.dumps(header))
            h["__metadata__"][key] = b.decode()
            out.append((tag, pack(h)))
    return out


# ---- GGUF, CTranslate2, Marian, ONNX: header fields through the writers -----------------
def gguf_fields(q8: bool, ints: list, wrong: list, seed=None) -> list[tuple[str, bytes]]:
    meta, tensors = seed or gguf_seed(q8)
    out = [(f"gguf:version={v}", gguf_bytes(meta, tensors, version=v)) for v in (0, 1, 4, 2**32 - 1)]
    for v in (0, 2**40, 2**64 - 1):
        out += [(f"gguf:n_tensors={v}", gguf_bytes(meta, tensors, n_tensors=v)),
                (f"gguf:n_kv={v}", gguf_bytes(meta, tensors, n_kv=v))]
    typed = [(4, v) for v in ints if 0 <= v < 2**32] + [(10, v) for v in ints if v >= 2**32] \
        + [(5, -1), (8, "x"), (6, 1.5), (9, (4, [1, 2])), (7, True)]
    for j, (key, _, _) in enumerate(meta):
        if key.startswith("tokenizer"):
            continue
        for kind, v in typed if key != "general.architecture" else [(8, "falcon"), (8, ""),
                                                                       (4, 5)]:
            m = list(meta)
            m[j] = (key, kind, v)
            out.append((f"gguf:{key.split('.')[-1]}={json.dumps(v)[:12]}", gguf_bytes(m, tensors)))
    for v in (0, 3, 2**31):
        out.append((f"gguf:alignment={v}", gguf_bytes(meta + [("general.alignment", 4, v)], tensors)))
    for v in (2**40, 2**62, 13):
        out.append((f"gguf:array_count={v}",
                    gguf_bytes(meta, tensors, counts={"tokenizer.ggml.scores": v})))
    name = tensors[2][0]
    for field, values in {"n_dims": [0, 5, 2**32 - 1], "dims": [[0, 8], [2**40, 8], [2**63, 2]],
                          "type": [99, 2**32 - 1, 1], "offset": [1, 2**40, 2**64 - 32]}.items():
        for v in values:
            out.append((f"gguf:{name}.{field}={json.dumps(v)[:12]}",
                        gguf_bytes(meta, tensors, infos={name: {field: v}})))
    out.append(("gguf:duplicate_tensor", gguf_bytes(meta, tensors + [tensors[0]])))
    out.append(("gguf:key_length", gguf_bytes([("k" * 4, 8, "x")] + meta, tensors).replace(
        struct.pack("<Q", 4) + b"kkkk", struct.pack("<Q", 2**50) + b"kkkk", 1)))
    return out


def ct2_fields(ints: list, wrong: list) -> list[tuple[str, bytes]]:
    v = ct2_vars()
    out = [(f"ct2:version={x}", ct2_bytes(v, version=x)) for x in (0, 5, 9, 2**32 - 1)]
    out += [(f"ct2:n_vars={x}", ct2_bytes(v, n_vars=x)) for x in (0, 1, 2**32 - 1)]
    out += [(f"ct2:n_aliases={x}", ct2_bytes(v, n_aliases=x)) for x in (2, 2**32 - 1)]
    out.append(("ct2:alias_to_nothing", ct2_bytes(v, aliases=[("a", "nothing")])))
    out.append(("ct2:spec", ct2_bytes(v, spec="TransformerSpec")))
    for heads in (0, -1, 3, 32767):
        w = dict(v, **{"encoder/num_heads": np.array(heads, np.int16)})
        out.append((f"ct2:num_heads={heads}", ct2_bytes(w)))
    for bad in (np.array([2, 2], np.int16), np.array(1.5, np.float32)):
        out.append((f"ct2:num_heads_as={bad.dtype}{bad.shape}",
                    ct2_bytes(dict(v, **{"decoder/num_heads": bad}))))
    name = "encoder/layer_0/self_attention/linear_0/weight"
    for field, values in {"rank": [0, 1, 3, 255], "shape": [(0, 8), (2**32 - 1, 8), (8, 24)],
                          "code": [4, 9, 255], "nbytes": [0, 4, 2**32 - 1]}.items():
        for x in values:
            out.append((f"ct2:w.{field}={x}", ct2_bytes(v, over={name: {field: x}})))
    out.append(("ct2:scale_rows", ct2_bytes(dict(v, **{
        "decoder/layer_0/attention/linear_2/weight_scale": np.ones(3, np.float32)}))))
    out.append(("ct2:fused_rows", ct2_bytes(dict(v, **{name: v[name][:20].copy()}))))
    return out


def marian_fields(ints: list, wrong: list) -> list[tuple[str, bytes]]:
    it = marian_items()
    out = [(f"marian:version={v}", marian_bytes(it, version=v)) for v in (0, 2, 2**64 - 1)]
    out += [(f"marian:n={v}", marian_bytes(it, n=v)) for v in (0, 5, 99_999, 2**40)]
    out += [(f"marian:pad={v}", marian_bytes(it, pad=v)) for v in (0, 2**40)]
    for v in [0, -1, 10**30, "x", 2**31, 3]:
        out.append((f"marian:heads={v}", marian_bytes(it, yml=f"transformer-heads: {v}\n")))
    out.append(("marian:no_yml_heads", marian_bytes(it, yml="enc-depth: 1\n")))
    name = it[0][0]
    for field, values in {"name_len": [0, 2**40], "type": [0, 0x0404, 7], "shape_len": [0, 3, 2**40],
                          "data_len": [0, 64, 2**40], "shape": [(0, 8), (-1, 8), (2**31 - 1, 8),
                                                                (8, 8, 8)]}.items():
        for v in values:
            out.append((f"marian:w.{field}={v}", marian_bytes(it, over={name: {field: v}})))
    return out


def onnx_fields(ints: list, wrong: list) -> list[tuple[str, bytes]]:
    out = [(f"onnx:heads={h}", onnx_bytes(heads=h)) for h in (0, -1, 3, 2**40, 1.5)]
    out += [(f"onnx:w_dims={d}", onnx_bytes(w_dims=d)) for d in ([0], [-1, 8], [2**40, 8],
                                                                   [10**9, 10**9], [8, 8, 8])]
    out += [(f"onnx:w_type={t}", onnx_bytes(w_type=t)) for t in (0, 8, 11, 99)]
    out += [("onnx:external", onnx_bytes(external=True)), ("onnx:scale", onnx_bytes(scale=3)),
            ("onnx:add_same", onnx_bytes(add_same=True)), ("onnx:no_attr", onnx_bytes(no_attr=True))]
    return out


def field_mutations(name: str, raw: bytes, ints: list, wrong: list) -> list[tuple[str, bytes]]:
    """Every header-field mutation of seed ``name`` (whose target file holds ``raw``), then the
    hostile edits of :mod:`fuzz_hostile` that keep the file well formed."""
    if name == "store":
        return fuzz_hostile.store_edits(raw)
    if name in ("qkvlab", "bert_weights", "llama_weights"):
        return safetensors_fields(raw, ints, wrong) + fuzz_hostile.safetensors_values(raw)
    if name in ("qkvlab_api", "ckpt"):
        return safetensors_fields(raw, ints, wrong)
    if name.startswith("gguf"):
        q8, seed = name == "gguf_q8", gguf_lm_seed() if name == "gguf_lm" else None
        return (gguf_fields(q8, ints, wrong, seed) + fuzz_hostile.gguf_values(q8, seed)
                + fuzz_hostile.gguf_consistency(q8, seed))
    hostile = {"ct2": fuzz_hostile.ct2_values, "marian": fuzz_hostile.marian_values}
    fields = {"ct2": ct2_fields, "marian": marian_fields, "onnx": onnx_fields}
    if name in fields:
        return fields[name](ints, wrong) + (hostile[name]() if name in hostile else [])
    out = json_fields(raw, ints + wrong)  # configs, run specs, tokenizers
    if name in ("bert", "gpt2", "llama", "whisper"):
        out += fuzz_hostile.config_edits(raw)
    if name == "spec":
        out += fuzz_hostile.spec_code(raw)
    return out


# ---- seeds ------------------------------------------------------------------------------------
def ckpt_model():
    """The model and optimizer the training-checkpoint seed was saved from (fresh each call)."""
    import torch

    from qkvlab import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_vocab=11, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _hf(folder: Path, config: dict, tensors: dict) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(folder / "model.safetensors"))
    return folder


def write_seeds(root: Path) -> dict:
    import torch

    from qkvlab import ModelConfig, build_model, save_model
    from qkvlab.data.tokenizers import BPETokenizer, CharTokenizer
    from qkvlab.train.checkpoints import save_checkpoint

    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    torch.manual_seed(0)
    qk = save_model(build_model(ModelConfig(d_vocab=13, n_ctx=8, d_model=8, n_layers=2,
                                            n_heads=2, design="tied_kv")), root / "qkvlab.safetensors")
    model, opt = ckpt_model()
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    ck = save_checkpoint(root / "ckpt.safetensors", model, opt, step=1,
                         rng={"torch": torch.get_rng_state()}, state={"history": [{"step": 1}]})
    D = 8
    bert = {f"encoder.layer.{i}.attention.{n}.{p}": r(D, D) if p == "weight" else r(D)
            for i in range(2) for n in ("self.query", "self.key", "self.value", "output.dense")
            for p in ("weight", "bias")}
    bert = _hf(root / "bert", {"model_type": "bert", "hidden_size": D, "num_attention_heads": 2,
                               "num_hidden_layers": 2, "intermediate_size": 16,
                               "vocab_size": 20}, bert)
    gpt2 = {k: v for i in range(2) for k, v in (
        (f"h.{i}.attn.c_attn.weight", r(D, 3 * D)), (f"h.{i}.attn.c_attn.bias", r(3 * D)),
        (f"h.{i}.attn.c_proj.weight", r(D, D)), (f"h.{i}.attn.c_proj.bias", r(D)))}
    gpt2 = _hf(root / "gpt2", {"model_type": "gpt2", "n_head": 2, "n_layer": 2, "n_embd": D}, gpt2)
    llama = {f"model.layers.{i}.self_attn.{p}_proj.weight": r(D if p in "qo" else D // 2, D)
             for i in range(2) for p in "qkvo"}
    llama = _hf(root / "llama", {"model_type": "llama", "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "num_hidden_layers": 2,
                                 "hidden_size": D}, llama)
    whisper = {}
    for stack, mod in (("encoder", "self_attn"), ("decoder", "self_attn"), ("decoder", "encoder_attn")):
        for p in ("q", "k", "v", "out"):
            whisper[f"model.{stack}.layers.0.{mod}.{p}_proj.weight"] = r(D, D)
            if p != "k":
                whisper[f"model.{stack}.layers.0.{mod}.{p}_proj.bias"] = r(D)
    whisper = _hf(root / "whisper", {"model_type": "whisper", "encoder_layers": 1,
                                     "decoder_layers": 1, "encoder_attention_heads": 2,
                                     "decoder_attention_heads": 2}, whisper)
    files = {"gguf.gguf": gguf_bytes(*gguf_seed()), "gguf_q8.gguf": gguf_bytes(*gguf_seed(True)),
             "gguf_lm.gguf": gguf_bytes(*gguf_lm_seed()),
             "ct2/model.bin": ct2_bytes(ct2_vars()), "marian.bin": marian_bytes(marian_items()),
             "vit.onnx": onnx_bytes()}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    spec = {"task": "lm", "task_options": {"seq_len": 16}, "kind": "decoder",
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "design": "tied_kv"},
            "train": {"steps": 5, "batch_size": 2, "lr": 0.003}}
    (root / "spec.json").write_text(json.dumps(spec))
    (root / "char.json").write_text(CharTokenizer.train(["hello world"]).to_json())
    bpe = BPETokenizer.train(["hello world, hello there"] * 20, 300)
    (root / "bpe.json").write_text(bpe.to_json())
    fuzz_hostile.plant(root, [bert, gpt2, llama, whisper])
    store = fuzz_hostile.write_store(root / "store.db", spec)
    return {"qkvlab": ("analyze", qk, qk), "qkvlab_api": ("load_model", qk, qk),
            "ckpt": ("checkpoint", ck, ck),
            "bert": ("analyze", bert, bert / "config.json"),
            "bert_weights": ("analyze", bert, bert / "model.safetensors"),
            "gpt2": ("analyze", gpt2, gpt2 / "config.json"),
            "llama": ("analyze", llama, llama / "config.json"),
            "whisper": ("analyze", whisper, whisper / "config.json"),
            "gguf": ("analyze", root / "gguf.gguf", root / "gguf.gguf"),
            "gguf_q8": ("analyze", root / "gguf_q8.gguf", root / "gguf_q8.gguf"),
            "ct2": ("analyze", root / "ct2/model.bin", root / "ct2/model.bin"),
            "marian": ("analyze", root / "marian.bin", root / "marian.bin"),
            "onnx": ("analyze", root / "vit.onnx", root / "vit.onnx"),
            "spec": ("spec", root / "spec.json", root / "spec.json"),
            "tok_char": ("tokenizer", root / "char.json", root / "char.json"),
            "tok_bpe": ("tokenizer", root / "bpe.json", root / "bpe.json"),
            "llama_weights": ("analyze", llama, llama / "model.safetensors"),
            "gguf_lm": ("lm", root / "gguf_lm.gguf", root / "gguf_lm.gguf"),
            "store": ("store", store, store)}
