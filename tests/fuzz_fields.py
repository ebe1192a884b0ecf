"""The fuzz test's seeds, one small valid input per format, and each format's header fields.

Binary formats are written here by small writers that take every header field as an argument
(GGUF, CTranslate2, Marian), so a field can be set to any value, including ones no real writer
would produce; safetensors headers and JSON documents are rewritten field by field.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

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
            inner = json.loads(text)
        except ValueError:
            continue
        for tag, b in json_fields(text.encode(), ints + wrong, prefix=f"st:{key}")[3:]:
            h = json.loads(json.dumps(header))
            h["__metadata__"][key] = b.decode()
            out.append((tag, pack(h)))
        del inner
    return out


# ---- GGUF -------------------------------------------------------------------------------------
GGUF_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}


def _gs(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def _gvalue(kind: int, value, count: int | None = None) -> bytes:
    if kind == 8:
        return _gs(value)
    if kind == 9:
        item, items = value
        head = struct.pack("<IQ", item, len(items) if count is None else count)
        return head + b"".join(_gvalue(item, x) for x in items)
    return struct.pack("<" + GGUF_FMT[kind], value)


def gguf_bytes(meta: list, tensors: list, *, version=3, n_tensors=None, n_kv=None,
               counts: dict | None = None, infos: dict | None = None) -> bytes:
    """A GGUF file: ``meta`` = [(key, type, value)], ``tensors`` = [(name, dims innermost
    first, ggml type, data bytes)]; ``counts`` overrides an array's stated length by key,
    ``infos`` a tensor entry's fields by name (n_dims, dims, type, offset)."""
    counts, infos = counts or {}, infos or {}
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(meta) if n_kv is None else n_kv)
    for key, kind, value in meta:
        out += _gs(key) + struct.pack("<I", kind) + _gvalue(kind, value, counts.get(key))
    offset, blobs = 0, b""
    for name, dims, gtype, data in tensors:
        o = {"n_dims": len(dims), "dims": dims, "type": gtype, "offset": offset,
             **infos.get(name, {})}
        out += _gs(name) + struct.pack("<I", o["n_dims"]) + b"".join(
            struct.pack("<Q", d % 2**64) for d in o["dims"])
        out += struct.pack("<IQ", o["type"] % 2**32, o["offset"] % 2**64)
        pad = b"\0" * (-len(data) % 32)
        blobs += data + pad
        offset += len(data) + len(pad)
    return out + b"\0" * (-len(out) % 32) + blobs


def gguf_seed(q8: bool = False):
    """(meta, tensors) of a tiny llama GGUF: F32 with width 8, or Q8_0 with width 32."""
    import gguf

    D, H, G, L, F, V = (32, 4, 2, 1, 32, 8) if q8 else (8, 4, 2, 2, 16, 12)
    rng = np.random.default_rng(1)
    meta = [("general.architecture", 8, "llama"), ("llama.block_count", 4, L),
            ("llama.context_length", 4, 64), ("llama.embedding_length", 4, D),
            ("llama.feed_forward_length", 4, F), ("llama.attention.head_count", 4, H),
            ("llama.attention.head_count_kv", 4, G),
            ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
            ("tokenizer.ggml.tokens", 9, (8, [f"t{i}" for i in range(V)])),
            ("tokenizer.ggml.scores", 9, (6, [0.0] * V))]
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    for i in range(L):
        shapes.update({f"blk.{i}.attn_q.weight": (D, D), f"blk.{i}.attn_k.weight": (D // 2, D),
                       f"blk.{i}.attn_v.weight": (D // 2, D), f"blk.{i}.attn_output.weight": (D, D),
                       f"blk.{i}.ffn_up.weight": (F, D), f"blk.{i}.ffn_gate.weight": (F, D),
                       f"blk.{i}.ffn_down.weight": (D, F), f"blk.{i}.attn_norm.weight": (D,),
                       f"blk.{i}.ffn_norm.weight": (D,)})
    tensors = []
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        if q8 and a.ndim == 2:
            data = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0).tobytes()
            tensors.append((name, list(reversed(shape)), 8, data))
        else:
            tensors.append((name, list(reversed(shape)), 0, a.tobytes()))
    return meta, tensors


def gguf_fields(q8: bool, ints: list, wrong: list) -> list[tuple[str, bytes]]:
    meta, tensors = gguf_seed(q8)
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


# ---- CTranslate2 ------------------------------------------------------------------------------
def ct2_vars(D: int = 8, H: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    v = {"encoder/num_heads": np.array(H, np.int16), "decoder/num_heads": np.array(H, np.int16)}

    def lin(name, rows):
        v[f"{name}/weight"] = rng.standard_normal((rows, D)).astype(np.float32)
        v[f"{name}/bias"] = rng.standard_normal(rows).astype(np.float32)

    for stack in ("encoder", "decoder"):
        lin(f"{stack}/layer_0/self_attention/linear_0", 3 * D)
        lin(f"{stack}/layer_0/self_attention/linear_1", D)
    lin("decoder/layer_0/attention/linear_0", D)
    lin("decoder/layer_0/attention/linear_1", 2 * D)
    lin("decoder/layer_0/attention/linear_2", D)
    w = v["decoder/layer_0/attention/linear_2/weight"]  # one int8 weight with its scale
    v["decoder/layer_0/attention/linear_2/weight"] = np.round(w * 40).astype(np.int8)
    v["decoder/layer_0/attention/linear_2/weight_scale"] = np.full(D, 40.0, np.float32)
    return v


CT2_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2}


def ct2_bytes(var: dict, *, version=6, spec="WhisperSpec", n_vars=None, aliases=None,
              n_aliases=None, over: dict | None = None) -> bytes:
    """A CTranslate2 model.bin; ``over`` overrides one variable's rank, shape, code or
    byte count by name."""
    def s(x: str) -> bytes:
        b = x.encode() + b"\0"
        return struct.pack("<H", len(b)) + b

    aliases = [("decoder/projection/weight", "decoder/layer_0/attention/linear_0/weight")] \
        if aliases is None else aliases
    out = struct.pack("<I", version) + s(spec) + struct.pack("<II", 1, len(var) if n_vars is None
                                                             else n_vars)
    for name, a in var.items():
        o = {"rank": a.ndim, "shape": a.shape, "code": CT2_CODES[a.dtype], "nbytes": a.nbytes,
             **(over or {}).get(name, {})}
        out += s(name) + struct.pack("<B", o["rank"] % 256) + b"".join(
            struct.pack("<I", d % 2**32) for d in o["shape"])
        out += struct.pack("<BI", o["code"] % 256, o["nbytes"] % 2**32) + a.tobytes()
    out += struct.pack("<I", len(aliases) if n_aliases is None else n_aliases)
    return out + b"".join(s(a) + s(t) for a, t in aliases)


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


# ---- Marian -----------------------------------------------------------------------------------
def marian_items(D: int = 8) -> list:
    rng = np.random.default_rng(3)
    items = []
    for stack, kind in (("encoder", "self"), ("decoder", "context")):
        for r in "qkvo":
            w = rng.standard_normal((D, D)).astype(np.float32)
            m = np.float32(127.0 / np.abs(w).max())
            q = np.clip(np.round(w.T * m), -127, 127).astype(np.int8)
            data = q.tobytes() + struct.pack("<f", m)
            items.append((f"{stack}_l1_{kind}_W{r}", 0x4101, (D, D), data + b"\0" * (-len(data) % 256)))
            items.append((f"{stack}_l1_{kind}_b{r}", 0x0404, (1, D),
                          rng.standard_normal(D).astype(np.float32).tobytes()))
    return items


def marian_bytes(items: list, *, yml="transformer-heads: 2\n", version=1, n=None, pad=3,
                 over: dict | None = None) -> bytes:
    y = yml.encode() + b"\0"
    items = items + [("special:model.yml", 0x0101, (len(y),), y)]
    out = struct.pack("<QQ", version % 2**64, (len(items) if n is None else n) % 2**64)
    heads = []
    for name, typ, shape, data in items:
        o = {"name_len": len(name) + 1, "type": typ, "shape_len": len(shape),
             "data_len": len(data), "shape": shape, **(over or {}).get(name, {})}
        heads.append(o)
        out += struct.pack("<QQQQ", *(o[k] % 2**64 for k in ("name_len", "type", "shape_len",
                                                            "data_len")))
    out += b"".join(n.encode() + b"\0" for n, *_ in items)
    out += b"".join(struct.pack(f"<{len(o['shape'])}i", *(d if -2**31 <= d < 2**31 else -1
                                                          for d in o["shape"])) for o in heads)
    return out + struct.pack("<Q", pad % 2**64) + b"\0" * min(pad, 3) + b"".join(
        d for *_, d in items)


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


# ---- ONNX -------------------------------------------------------------------------------------
def onnx_bytes(heads=2, w_dims=None, w_type=None, external=False, scale=8, add_same=False,
               no_attr=False) -> bytes:
    """A two-layer ViT-shaped graph as ``load_onnx_vit`` reads it (see its module docstring)."""
    from onnx import TensorProto, helper, numpy_helper

    D = 8
    rng = np.random.default_rng(4)
    nodes, inits = [], []

    def const(name, value):
        if no_attr and name.startswith("h_"):
            return helper.make_node("Constant", [], [name])
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))

    for i in range(2):
        pre = f"dino.encoder.layer.{i}."
        for r, src in (("query", "x"), ("key", "x"), ("value", "x"), ("output.dense", f"v{i}")):
            bias = f"{pre}attention.{'attention.' if r != 'output.dense' else ''}{r}.bias"
            w = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32),
                                        f"onnx::MatMul_{i}{r}")
            if i == 0 and r == "query":
                if w_dims is not None:
                    del w.dims[:]
                    w.dims.extend(w_dims)
                if w_type is not None:
                    w.data_type = w_type
                if external:
                    w.data_location = TensorProto.EXTERNAL
                    w.external_data.add(key="location", value="/etc/hostname")
            inits += [w, numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), bias)]
            out = {"query": f"q{i}", "key": f"k{i}", "value": f"v{i}", "output.dense": f"o{i}"}[r]
            nodes += [helper.make_node("MatMul", [src, w.name], [f"mm{i}{r}"]),
                      helper.make_node("Add", [bias, bias] if add_same and i == 0 else
                                       [f"mm{i}{r}", bias], [out])]
        inits.append(numpy_helper.from_array(np.ones(scale, np.float32),
                                             f"{pre}layer_scale1.lambda1"))
        nodes += [const(f"c0_{i}", np.array([1], np.int64)), const(f"c1_{i}", np.array([3], np.int64)),
                  const(f"h_{i}", np.array([heads], np.int64 if isinstance(heads, int)
                                           else np.float32)),
                  const(f"c3_{i}", np.array([D // 2], np.int64)),
                  helper.make_node("Concat", [f"c0_{i}", f"c1_{i}", f"h_{i}", f"c3_{i}"],
                                   [f"shape{i}"], axis=0),
                  helper.make_node("Reshape", [f"q{i}", f"shape{i}"], [f"qh{i}"])]
    graph = helper.make_graph(nodes, "vit", [helper.make_tensor_value_info("x", 1, [1, 3, D])],
                              [helper.make_tensor_value_info("o1", 1, None)], initializer=inits)
    return helper.make_model(graph).SerializeToString()


def onnx_fields(ints: list, wrong: list) -> list[tuple[str, bytes]]:
    out = [(f"onnx:heads={h}", onnx_bytes(heads=h)) for h in (0, -1, 3, 2**40, 1.5)]
    out += [(f"onnx:w_dims={d}", onnx_bytes(w_dims=d)) for d in ([0], [-1, 8], [2**40, 8],
                                                                   [10**9, 10**9], [8, 8, 8])]
    out += [(f"onnx:w_type={t}", onnx_bytes(w_type=t)) for t in (0, 8, 11, 99)]
    out += [("onnx:external", onnx_bytes(external=True)), ("onnx:scale", onnx_bytes(scale=3)),
            ("onnx:add_same", onnx_bytes(add_same=True)), ("onnx:no_attr", onnx_bytes(no_attr=True))]
    return out


def field_mutations(name: str, raw: bytes, ints: list, wrong: list) -> list[tuple[str, bytes]]:
    """Every header-field mutation of seed ``name`` (whose target file holds ``raw``)."""
    if name in ("qkvlab", "qkvlab_api", "ckpt", "bert_weights"):
        return safetensors_fields(raw, ints, wrong)
    if name.startswith("gguf"):
        return gguf_fields(name == "gguf_q8", ints, wrong)
    fields = {"ct2": ct2_fields, "marian": marian_fields, "onnx": onnx_fields}
    if name in fields:
        return fields[name](ints, wrong)
    return json_fields(raw, ints + wrong)  # configs, run specs, tokenizers


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
            "tok_bpe": ("tokenizer", root / "bpe.json", root / "bpe.json")}
