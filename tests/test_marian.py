"""Marian .bin reader: no reference implementation runs here (no Marian runtime), so these
tests check what can be checked without one.

A synthetic file written here the way Marian's ``packAndSave`` writes intgemm8 weights
(transpose all but Wemb, quantize with m = 127/max|W|, multiplier after the values, blocks
padded to 256 bytes) must read back as nn.Linear-layout matrices equal to the quantized W, and
its heads as contiguous column blocks of W. On the real zoo files (when fetched): shapes,
every dequantized weight re-quantizes to its stored int8 value, and the per-tensor maximum
sits at ±127 as the symmetric quantizer puts it.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from qkvlab.analysis import zoo
from qkvlab.inputs import InputFileError
from qkvlab.analysis.load_marian import FLOAT32, INTGEMM8, load_marian, read_marian

YML = "transformer-heads: 2\ntransformer-postprocess: dan\nenc-depth: 1\n"


def write_marian(path, weights: dict[str, np.ndarray], floats: dict[str, np.ndarray]):
    """A Marian binary file as ``ExpressionGraphPackable::packAndSave`` lays it out."""
    items = []
    for name, w in weights.items():
        m = np.float32(127.0 / np.abs(w).max())
        stored = w if name == "Wemb" else w.T  # Marian transposes all but Wemb
        q = np.clip(np.round(stored * m), -127, 127).astype(np.int8)
        data = q.tobytes() + struct.pack("<f", m)
        data += b"\0" * (-len(data) % 256)
        items.append((name, INTGEMM8, w.shape, data))
    for name, a in floats.items():
        items.append((name, FLOAT32, a.shape, a.astype(np.float32).tobytes()))
    yml = YML.encode() + b"\0"
    items.append(("special:model.yml", 0x0101, (len(yml),), yml))
    out = struct.pack("<QQ", 1, len(items))
    for name, typ, shape, data in items:
        out += struct.pack("<QQQQ", len(name) + 1, typ, len(shape), len(data))
    out += b"".join(n.encode() + b"\0" for n, *_ in items)
    out += b"".join(struct.pack(f"<{len(s)}i", *s) for _, _, s, _ in items)
    out += struct.pack("<Q", 3) + b"\0" * 3
    out += b"".join(d for *_, d in items)
    path.write_bytes(out)
    return path


def test_synthetic_marian_file_reads_back_in_linear_layout(tmp_path):
    rng = np.random.default_rng(0)
    D = 8
    ws = {f"encoder_l1_self_W{r}": rng.standard_normal((D, D)).astype(np.float32) for r in "qkvo"}
    ws["Wemb"] = rng.standard_normal((11, D)).astype(np.float32)
    bs = {f"encoder_l1_self_b{r}": rng.standard_normal((1, D)) for r in "qkvo"}
    path = write_marian(tmp_path / "model.bin", ws, bs)
    t, q, _ = read_marian(path)
    for name, w in ws.items():
        m = 127.0 / np.abs(w).max()
        want = np.round(w * m) / m  # what the file can hold: W quantized
        got = t[name] if name == "Wemb" else t[name].T  # back to Marian's (d_in, d_out)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert q[name].dtype == np.int8
    view = load_marian(path)
    lay = view.layers[0]
    assert (lay.n_heads, lay.d_head) == (2, D // 2)
    x = torch.randn(5, D, dtype=torch.float64)
    for r in "qkv":  # Marian: y = x·W + b, heads are contiguous column blocks of y
        W = torch.from_numpy(t[f"encoder_l1_self_W{r}"].T).double()
        y = x @ W + torch.from_numpy(bs[f"encoder_l1_self_b{r}"].astype(np.float32)).double()
        assert_close(lay.project(x, r), y.reshape(5, 2, D // 2).transpose(0, 1), rtol=1e-12,
                     atol=1e-12)


def test_truncated_or_foreign_marian_file_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    path = write_marian(tmp_path / "m.bin", {"encoder_l1_self_Wq": rng.standard_normal((4, 4))}, {})
    data = path.read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-300])
    with pytest.raises(InputFileError, match="truncated"):
        read_marian(tmp_path / "cut.bin")
    (tmp_path / "other.bin").write_bytes(struct.pack("<QQ", 7, 3) + b"\0" * 64)
    with pytest.raises(InputFileError, match="not a Marian binary model"):
        read_marian(tmp_path / "other.bin")


@pytest.mark.parametrize("name", ["marian-enpt", "marian-pten"])
def test_real_marian_weights_round_trip_their_int8(name):
    m = zoo.get(name)
    found = zoo.locate(m)
    if found is None:
        pytest.skip(f"{name} is not fetched: run `qkvlab zoo fetch {name}`")
    t, q, yml = read_marian(found[0] / m.entry)
    assert "transformer-heads: 8" in yml and "transformer-postprocess: dan" in yml
    view = load_marian(found[0] / m.entry)
    assert [(lay.role, lay.n_heads, lay.d_model, lay.d_head) for lay in view.layers] == \
        [("encoder", 8, 256, 32)] * 6 + [("cross", 8, 256, 32)] * 2
    quantized = [k for k in q if not k.endswith("/quant_mult")]
    assert len(quantized) > 40
    for k in quantized:
        mult = q[f"{k}/quant_mult"]
        assert np.abs(q[k]).max() == 127, k  # symmetric per-tensor quantizer: max |q| = 127
        np.testing.assert_array_equal(np.round(t[k] * mult).astype(np.int8), q[k])
        assert np.isfinite(t[k]).all() and 0 < np.abs(t[k]).max() <= 127 / mult * (1 + 1e-6)
