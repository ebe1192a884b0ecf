"""ViT encoders (DINOv2 as exported by ``torch.onnx`` from transformers) from an ONNX graph.

Read with the ``onnx`` package only (protobuf parsing; no runtime, nothing executed). The
exporter keeps the biases under their module names
(``…encoder.layer.{i}.attention.attention.query.bias``) but stores each nn.Linear weight as an
anonymous, transposed initializer (``onnx::MatMul_1972``, shape (D_in, D_out)) feeding a
``MatMul`` whose output is added to that bias; the weight is found by walking the graph from
the bias's ``Add`` node back to its ``MatMul``. Head counts come from the ``Reshape`` that splits
q into heads. DINOv2 blocks are pre-norm (``norm1`` before attention) and scale the attention
output by ``layer_scale1.lambda1`` before the residual add; that scale is folded into W_O and
b_O, so W_O is the head's effective map into the residual stream.

No activation CKA: the graph takes images and none ship offline.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from qkvlab.analysis._files import as_input_error, require_file
from qkvlab.inputs import InputFileError
from qkvlab.analysis.heads import ModelView, from_linear
from qkvlab.inputs import bounded_int, check_memory

_BIAS = re.compile(r"^(.*encoder\.layer\.([0-9]{1,9})\.)attention\.attention\.query\.bias$")


def _graph(path: Path):
    try:
        import onnx  # lazy: optional extra [analysis]
        from onnx import numpy_helper
    except ImportError:
        raise InputFileError(f"{path}: reading ONNX needs the onnx package "
                              "(pip install onnx)") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 (DecodeError and others on a corrupt protobuf)
        raise InputFileError(f"{path}: not a readable ONNX model ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    return model.graph, numpy_helper


def load_onnx_vit(path: str | Path, *, name: str | None = None) -> ModelView:
    """Every self-attention layer of a ViT/DINOv2 ONNX graph (role ``encoder``).

    Raises:
        InputFileError: not ONNX, no ``encoder.layer.{i}.attention`` biases, a weight that is
            not reached through MatMul -> Add, or an unreadable head count.
    """
    path = require_file(path)
    check_memory(path, 3 * path.stat().st_size, "parsing its graph")  # protobuf + float64 copies
    graph, numpy_helper = _graph(path)
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)

    size = path.stat().st_size

    def arr(name: str) -> torch.Tensor:
        t = inits[name]
        if t.data_location == 1 or t.external_data:  # EXTERNAL: data in another file
            raise InputFileError(f"{path}: initializer {name!r} keeps its data in another file "
                                  "(ONNX external data); qkvlab reads only the graph's own file")
        if any(d < 0 for d in t.dims) or math.prod(t.dims) > size:
            raise InputFileError(f"{path}: initializer {name!r} has dimensions {list(t.dims)}, "
                                  f"more values than the {size:,}-byte file can hold")
        try:
            a = numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 (data that does not fill its dims, bad dtypes)
            raise InputFileError(f"{path}: initializer {name!r} (dimensions {list(t.dims)}) is "
                                  f"unreadable ({type(e).__name__}: {str(e)[:200]})") from None
        if not np.issubdtype(a.dtype, np.number):
            raise InputFileError(f"{path}: initializer {name!r} holds {a.dtype}, not numbers")
        return torch.from_numpy(a.astype(np.float64))

    def linear(bias: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (out, in), bias) of the nn.Linear whose bias is the initializer ``bias``."""
        if bias not in inits:
            raise InputFileError(f"{path}: initializer {bias!r} not found")
        for add in consumers.get(bias, []):
            if add.op_type != "Add":
                continue
            other = next((i for i in add.input if i != bias), None)
            mm = producer.get(other)
            if mm is not None and mm.op_type == "MatMul" and len(mm.input) == 2 \
                    and mm.input[1] in inits:
                w = arr(mm.input[1])
                if w.dim() != 2:
                    raise InputFileError(f"{path}: the weight of {bias} has shape "
                                          f"{tuple(w.shape)}, not a matrix")
                return w.T.contiguous(), arr(bias)
        raise InputFileError(f"{path}: no MatMul -> Add({bias}) with a stored weight")

    def n_heads(q_bias: str) -> int:
        """The head count in the Reshape (B, T, H, d) applied to q = MatMul + bias."""
        adds = [n for n in consumers.get(q_bias, []) if n.op_type == "Add" and n.output]
        for node in consumers.get(adds[0].output[0], []) if adds else []:
            if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in producer:
                concat = producer[node.input[1]]
                if concat.op_type == "Concat" and len(concat.input) == 4:
                    const = producer.get(concat.input[2])
                    if const is not None and const.op_type == "Constant" and const.attribute:
                        try:
                            value = numpy_helper.to_array(const.attribute[0].t).reshape(-1)[:1]
                        except Exception:  # noqa: BLE001 (a damaged constant: said below)
                            break
                        return bounded_int(value, f"the head count of {q_bias}", str(path),
                                           bound="heads")
        raise InputFileError(f"{path}: cannot read the head count of {q_bias}")

    # a damaged protobuf may hand back a name that is not UTF-8 as bytes: never a bias name
    found = sorted((int(m.group(2)), m.group(1)) for t in inits
                   if isinstance(t, str) and (m := _BIAS.match(t)))
    if not found:
        raise InputFileError(f"{path}: no '…encoder.layer.N.attention.attention.query.bias' "
                              "initializer; not a ViT/DINOv2 ONNX export")
    layers = []
    for i, pre in found:
        a = f"{pre}attention."
        H = n_heads(f"{a}attention.query.bias")
        W_o, b_o = linear(f"{a}output.dense.bias")
        scale = f"{pre}layer_scale1.lambda1"
        if scale in inits:  # out = lambda1 * (z W_O + b_O): fold into the output map
            lam = arr(scale)
            if lam.shape != (W_o.shape[0],) or b_o.shape != lam.shape:
                raise InputFileError(f"{path}: {scale} has shape {tuple(lam.shape)}, the "
                                      f"output map of layer {i} {tuple(W_o.shape)}")
            W_o, b_o = W_o * lam[:, None], b_o * lam
        try:
            layers.append(from_linear(i, "encoder", linear(f"{a}attention.query.bias"),
                                      linear(f"{a}attention.key.bias"),
                                      linear(f"{a}attention.value.bias"), (W_o, b_o), n_heads=H,
                                      name=f"encoder.{i}"))
        except ValueError as e:
            raise as_input_error(path, f"layer {i}", e) from None
    notes = ["ONNX graph read without a runtime; layer_scale1 folded into W_O, b_O",
             "a vision encoder: inputs are 14x14 image patches, not tokens"]
    return ModelView(name=name or path.stem, family="vit", source=str(path), layers=layers,
                     notes=notes, meta={"format": "onnx"})
