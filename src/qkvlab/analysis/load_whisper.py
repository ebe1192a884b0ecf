"""Whisper: HF folders and CTranslate2 ``model.bin``; encoder self, decoder self and cross.

HF layout: ``model.{encoder|decoder}.layers.{i}.self_attn.{q,k,v,out}_proj`` and
``model.decoder.layers.{i}.encoder_attn.*`` (k_proj has no bias).

CTranslate2 layout (read with numpy, nothing executed): ``{stack}/layer_{i}/self_attention/
linear_0`` is the fused (3D, D) [W_Q; W_K; W_V], ``linear_1`` the output; cross-attention
``decoder/layer_{i}/attention/linear_0`` is W_Q, ``linear_1`` the fused (2D, D) [W_K; W_V],
``linear_2`` the output. Head counts are stored as int16 scalars ``{stack}/num_heads``.

File format (CTranslate2 ``ModelSpec.save``, binary version 5/6, little-endian)::

    u32 version | str spec name | u32 revision | u32 n_vars
    n_vars × (str name | u8 rank | rank × u32 dim | u8 dtype | u32 n_bytes | bytes)
    u32 n_aliases | n_aliases × (str alias | str target)
    str = u16 length incl. NUL | utf-8 bytes | NUL
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

import numpy as np
import torch

from qkvlab.analysis._files import (
    as_input_error,
    check_layers,
    config_int,
    count_layers,
    read_json,
    read_tensors,
    require_file,
    safetensors_files,
    take,
)
from qkvlab.inputs import InputFileError
from qkvlab.analysis.heads import LayerView, ModelView, from_linear
from qkvlab.inputs import bounded_int, check_memory

# CTranslate2 DataType ids (include/ctranslate2/types.h)
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
CT2_VERSIONS = (5, 6)
MAX_RANK = 8  # CTranslate2 variables are scalars, vectors and matrices (conv weights: rank 3)


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise InputFileError(f"{self.path}: CTranslate2 file is truncated (needs byte "
                                  f"{self.pos + n}, has {len(self.buf)})")
        out = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return out

    def u(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = bytes(self.take(self.u("H")))
        if not raw.endswith(b"\0"):
            raise InputFileError(f"{self.path}: corrupt CTranslate2 string at byte {self.pos}")
        return raw[:-1].decode("utf-8", errors="replace")


def read_ct2(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}) of a CTranslate2 ``model.bin``; aliases resolved.

    int8-quantized weights are dequantized with their ``weight_scale``; bfloat16 widened.

    Raises:
        InputFileError: truncated/corrupt file, unknown version or dtype.
    """
    path = require_file(path)
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    c = _Cursor(buf, path)
    version = c.u("I")
    if version not in CT2_VERSIONS:
        raise InputFileError(f"{path}: CTranslate2 binary version {version} is not supported "
                              f"(supported: {list(CT2_VERSIONS)})")
    spec = c.string()
    c.u("I")  # spec revision
    n_vars = c.u("I")
    if n_vars > (len(buf) - c.pos) // 9:  # a variable takes at least 9 bytes
        raise InputFileError(f"{path}: {n_vars:,} variables cannot fit in the "
                              f"{len(buf) - c.pos:,} bytes left at byte {c.pos}")
    # int8 weights come back as float32: at most 4 bytes per stored byte, on top of the copy
    check_memory(path, 5 * len(buf), "reading its variables")
    out: dict[str, np.ndarray] = {}
    for _ in range(n_vars):
        name = c.string()
        rank = c.u("B")
        if rank > MAX_RANK:
            raise InputFileError(f"{path}: variable {name!r} has rank {rank} (at most {MAX_RANK})")
        shape = tuple(c.u("I") for _ in range(rank))
        code, n = c.u("B"), c.u("I")
        if code not in CT2_DTYPES:
            raise InputFileError(f"{path}: variable {name!r} has unknown dtype id {code}")
        raw = c.take(n)
        dt = CT2_DTYPES[code]
        size = 2 if dt == "bfloat16" else np.dtype(dt).itemsize
        if n != size * math.prod(shape):
            raise InputFileError(f"{path}: variable {name!r} holds {n:,} bytes for shape "
                                  f"{shape} of {np.dtype(np.uint16 if dt == 'bfloat16' else dt)}"
                                  f" ({size * math.prod(shape):,} bytes)")
        if dt == "bfloat16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dt)
        out[name] = arr.reshape(shape).copy()
    n_aliases = c.u("I")
    if n_aliases > (len(buf) - c.pos) // 6:  # two strings of at least 3 bytes
        raise InputFileError(f"{path}: {n_aliases:,} aliases cannot fit in the "
                              f"{len(buf) - c.pos:,} bytes left at byte {c.pos}")
    for _ in range(n_aliases):
        alias, target = c.string(), c.string()
        if target not in out:
            raise InputFileError(f"{path}: alias {alias!r} names variable {target!r}, which "
                                  "the file does not hold")
        out[alias] = out[target]
    for name in [k for k in out if k.endswith("/weight_scale")]:  # int8 weights: w = q / scale
        w = name[: -len("_scale")]
        scale = out.pop(name).astype(np.float32)
        if w not in out or out[w].ndim < 1 or scale.size not in (1, out[w].shape[0]):
            raise InputFileError(f"{path}: {name!r} ({scale.size} values) does not scale a "
                                  f"weight {w!r} with as many rows")
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero scale: refused by name
            out[w] = out[w].astype(np.float32) / scale.reshape(-1, *([1] * (out[w].ndim - 1)))
    return spec, out


def _ct2_linear(t: dict, name: str, path) -> tuple[torch.Tensor, torch.Tensor | None]:
    if f"{name}/weight" not in t:
        raise InputFileError(f"{path}: variable {name + '/weight'!r} not found")
    b = t.get(f"{name}/bias")
    return (torch.from_numpy(t[f"{name}/weight"].astype(np.float64)),
            None if b is None else torch.from_numpy(b.astype(np.float64)))


def _split(wb: tuple, n: int) -> list[tuple]:
    w, b = wb
    if w.dim() != 2 or w.shape[0] % n or (b is not None and b.shape != (w.shape[0],)):
        raise ValueError(f"a fused weight of shape {tuple(w.shape)} (bias "
                         f"{None if b is None else tuple(b.shape)}) does not split into {n} "
                         "equal projections")
    rows = w.shape[0] // n
    return [(w[j * rows:(j + 1) * rows], None if b is None else b[j * rows:(j + 1) * rows])
            for j in range(n)]


def load_ct2_whisper(path: str | Path, *, name: str | None = None) -> ModelView:
    """Encoder self, decoder self and cross-attention of a CTranslate2 Whisper ``model.bin``.

    Raises:
        InputFileError: corrupt file, a spec other than Whisper, missing variables.
    """
    path = Path(path)
    spec, t = read_ct2(path)
    if spec != "WhisperSpec":
        raise InputFileError(f"{path}: CTranslate2 spec {spec!r} is not supported; "
                              "supported: ['WhisperSpec']")
    heads = {s: bounded_int(t[f"{s}/num_heads"], f"{s}/num_heads", str(path), bound="heads")
             for s in ("encoder", "decoder") if f"{s}/num_heads" in t}
    if len(heads) < 2:
        raise InputFileError(f"{path}: encoder/num_heads or decoder/num_heads missing")
    layers: list[LayerView] = []
    for stack in ("encoder", "decoder"):
        i = 0
        while f"{stack}/layer_{i}/self_attention/linear_0/weight" in t:
            try:
                layers += _ct2_layer(t, stack, i, heads[stack], path)
            except ValueError as e:
                raise as_input_error(path, f"{stack} layer {i}", e) from None
            i += 1
    if not layers:
        raise InputFileError(f"{path}: no attention layers (encoder/layer_0/... missing)")
    notes = ["stored as float16 in CTranslate2 format"] if any(
        a.dtype == np.float16 for a in t.values() if a is not None) else []
    return ModelView(name=name or path.parent.name, family="whisper-ct2", source=str(path),
                     layers=layers, notes=notes, meta={"spec": spec, "heads_per_stack": heads})


def _ct2_layer(t: dict, stack: str, i: int, H: int, path) -> list[LayerView]:
    """Layer ``i`` of ``stack``: its self-attention, and for the decoder its cross-attention."""
    a = f"{stack}/layer_{i}/self_attention"
    q, k, v = _split(_ct2_linear(t, f"{a}/linear_0", path), 3)
    out = [from_linear(i, stack, q, k, v, _ct2_linear(t, f"{a}/linear_1", path), n_heads=H,
                       name=f"{stack}.{i}")]
    if stack == "decoder":
        a = f"decoder/layer_{i}/attention"
        k, v = _split(_ct2_linear(t, f"{a}/linear_1", path), 2)
        out.append(from_linear(i, "cross", _ct2_linear(t, f"{a}/linear_0", path), k, v,
                               _ct2_linear(t, f"{a}/linear_2", path), n_heads=H,
                               name=f"cross.{i}"))
    return out


def ct2_to_hf_encoder(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(WhisperConfig kwargs, WhisperEncoder state dict) from a CTranslate2 Whisper file.

    Used to build transformers' own WhisperEncoder for the parity test.
    """
    _, t = read_ct2(path)

    def g(name):
        return torch.from_numpy(t[name].astype(np.float32))

    sd = {"conv1.weight": g("encoder/conv1/weight"), "conv1.bias": g("encoder/conv1/bias"),
          "conv2.weight": g("encoder/conv2/weight"), "conv2.bias": g("encoder/conv2/bias"),
          "embed_positions.weight": g("encoder/position_encodings/encodings"),
          "layer_norm.weight": g("encoder/layer_norm/gamma"),
          "layer_norm.bias": g("encoder/layer_norm/beta")}
    n = 0
    while f"encoder/layer_{n}/self_attention/linear_0/weight" in t:
        a, h = f"encoder/layer_{n}", f"layers.{n}"
        w, b = g(f"{a}/self_attention/linear_0/weight"), g(f"{a}/self_attention/linear_0/bias")
        for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
            D = w.shape[1]
            sd[f"{h}.self_attn.{p}.weight"] = w[j * D:(j + 1) * D]
            if p != "k_proj":  # Whisper has no key bias; CTranslate2 stores zeros there
                sd[f"{h}.self_attn.{p}.bias"] = b[j * D:(j + 1) * D]
        for src, dst in (("self_attention/linear_1", "self_attn.out_proj"),
                         ("ffn/linear_0", "fc1"), ("ffn/linear_1", "fc2")):
            sd[f"{h}.{dst}.weight"], sd[f"{h}.{dst}.bias"] = (g(f"{a}/{src}/weight"),
                                                              g(f"{a}/{src}/bias"))
        for src, dst in (("self_attention/layer_norm", "self_attn_layer_norm"),
                         ("ffn/layer_norm", "final_layer_norm")):
            sd[f"{h}.{dst}.weight"], sd[f"{h}.{dst}.bias"] = (g(f"{a}/{src}/gamma"),
                                                              g(f"{a}/{src}/beta"))
        n += 1
    D = sd["conv1.weight"].shape[0]
    cfg = dict(d_model=D, encoder_layers=n, encoder_attention_heads=int(t["encoder/num_heads"]),
               encoder_ffn_dim=sd["layers.0.fc1.weight"].shape[0],
               num_mel_bins=sd["conv1.weight"].shape[1],
               max_source_positions=sd["embed_positions.weight"].shape[0])
    return cfg, sd


def load_hf_whisper(folder: str | Path, *, name: str | None = None) -> ModelView:
    """Encoder self, decoder self and cross-attention of an HF Whisper folder."""
    folder = Path(folder)
    cfg = read_json(folder / "config.json")
    if cfg.get("model_type") != "whisper":
        raise InputFileError(f"{folder}: model_type {cfg.get('model_type')!r} is not 'whisper'")
    files = safetensors_files(folder)
    t = read_tensors(files)
    anchor = next((k for k in t if k.endswith("encoder.layers.0.self_attn.q_proj.weight")), None)
    if anchor is None:
        raise InputFileError(f"{files[0]}: no encoder.layers.0.self_attn.q_proj.weight")
    pre = anchor[: -len("encoder.layers.0.self_attn.q_proj.weight")]
    layers = []
    spec = [("encoder", "encoder", "self_attn", "encoder_layers", "encoder_attention_heads"),
            ("decoder", "decoder", "self_attn", "decoder_layers", "decoder_attention_heads"),
            ("decoder", "cross", "encoder_attn", "decoder_layers", "decoder_attention_heads")]
    where = folder / "config.json"
    for stack, role, mod, n_key, h_key in spec:
        L = config_int(cfg, n_key, where, bound="layers")
        H = config_int(cfg, h_key, where, bound="heads")
        check_layers(where, L, count_layers(t, lambda i: f"{pre}{stack}.layers.{i}.{mod}"
                                            ".q_proj.weight"), n_key)
        for i in range(L):
            a = f"{pre}{stack}.layers.{i}.{mod}"

            def wb(p, a=a):  # bind this layer's prefix
                return take(t, f"{a}.{p}.weight", files[0], ndim=2), t.get(f"{a}.{p}.bias")

            try:
                layers.append(from_linear(i, role, wb("q_proj"), wb("k_proj"), wb("v_proj"),
                                          wb("out_proj"), n_heads=H, name=f"{role}.{i}"))
            except ValueError as e:
                raise as_input_error(files[0], f"{role} layer {i}", e) from None
    return ModelView(name=name or folder.name, family="whisper", source=str(folder),
                     layers=layers, meta={"model_type": "whisper",
                                          "init_std": cfg.get("init_std")})
