"""Writers of the binary formats the fuzz test damages: GGUF, CTranslate2, Marian and ONNX.

Each takes every header field as an argument, so a field can be set to any value, including
ones no real writer would produce (:mod:`fuzz_fields` does that); with the defaults they write
the small valid seeds (a tiny llama GGUF in float32 or Q8_0, a Whisper-layout CTranslate2
``model.bin`` with one int8 weight, a Marian int8 model, a two-layer ViT ONNX graph).
"""

from __future__ import annotations

import struct

import numpy as np


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


def gguf_lm_seed():
    """(meta, tensors) of the float llama GGUF with a tokenizer model named, which
    ``hf.cost.load_lm`` (``tiecost``, ``convert``) reads through transformers."""
    meta, tensors = gguf_seed()
    return meta + [("tokenizer.ggml.model", 8, "llama"),
                   ("tokenizer.ggml.token_type", 9, (5, [1] * 12))], tensors


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
