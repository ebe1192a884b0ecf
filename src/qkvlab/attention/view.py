"""The one per-head view of an attention layer, the form every reader of attention weights
shares: ``Attention.view()`` gives it for qkvlab's layers, the analysis loaders build it from
checkpoints of other libraries (``qkvlab.analysis.heads``), and the tests' float64 oracle reads
it (``tests/reference.py``).

Shape legend: H query heads, G stored key/value heads (GQA), D d_model, dk d_head, dv d_v,
N tokens. Per layer, in float64 and with GQA expanded (head h reads kv head h // (H/G), as
HF's ``repeat_kv`` and ``qkvlab.attention.repeat_kv``):

    q_h = x @ W_Q[h] + b_Q[h]        W_Q (H, D, dk)   b_Q (H, dk)
    k_h = s @ W_K[h] + b_K[h]        W_K (H, D, dk)   b_K (H, dk)
    v_h = s @ W_V[h] + b_V[h]        W_V (H, D, dv)   b_V (H, dv)
    out = Σ_h z_h @ W_O[h] + b_O     W_O (H, dv, D)   b_O (D,)

x is the input of the attention block (after the pre-norm where the model has one), s the
source (x itself, or the encoder output for cross-attention). ``W_O`` is each head's effective
output map (whatever a design applies between the softmax and its output projection folded
in), so a reader sees the function, not the storage. ``QK`` and ``OV`` are the heads' circuits
as factored products (``circuits.FactoredMatrix``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from qkvlab.attention.circuits import Circuits

ROLES = ("encoder", "decoder", "cross")
WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")  # a LayerView's tensors


def _f64(t: Tensor | None, grad: bool = False) -> Tensor | None:
    """A float64 CPU copy; with ``grad`` the graph back to ``t`` is kept (no detach)."""
    if t is None:
        return None
    # a copy even where the weight is float64 on the CPU already: a view of the module's
    # parameters would move with the next optimizer step
    return t.to(torch.float64).cpu() if grad else t.detach().to(torch.float64, copy=True).cpu()


@dataclass
class LayerView(Circuits):
    """One attention layer as per-head matrices (see the module docstring for shapes).

    ``role``: ``encoder`` (bidirectional self), ``decoder`` (causal self) or ``cross``.
    ``n_kv_heads``: heads as stored, before expansion (G < H is GQA). ``grad``: keep each
    tensor's graph back to the weights it was read from (the tests backpropagate through it);
    by default the view is a detached copy.
    """

    layer: int
    role: str
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor | None = None
    b_Q: Tensor | None = None
    b_K: Tensor | None = None
    b_V: Tensor | None = None
    b_O: Tensor | None = None
    n_kv_heads: int | None = None
    name: str = ""
    grad: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {list(ROLES)}")
        for k in WEIGHTS:
            setattr(self, k, _f64(getattr(self, k), self.grad))
        H, D, dk = self.W_Q.shape
        checks = {"W_K": (H, D, dk), "W_V": (H, D, self.W_V.shape[-1]), "b_Q": (H, dk),
                  "b_K": (H, dk), "b_V": (H, self.W_V.shape[-1]),
                  "W_O": (H, self.W_V.shape[-1], D), "b_O": (D,)}
        for k, want in checks.items():
            t = getattr(self, k)
            if t is not None and tuple(t.shape) != want:
                raise ValueError(f"{k}: shape {tuple(t.shape)} does not match {want} "
                                 f"(layer {self.layer}, {self.role})")
        if self.n_kv_heads is None:
            self.n_kv_heads = H
        if not self.name:
            self.name = f"{self.role}.{self.layer}"

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[2]

    @property
    def d_v(self) -> int:
        return self.W_V.shape[2]

    def project(self, x: Tensor, role: str) -> Tensor:
        """Per-head activations (H, N, d) of ``role`` in "qkv" for inputs x (N, D)."""
        W, b = {"q": (self.W_Q, self.b_Q), "k": (self.W_K, self.b_K),
                "v": (self.W_V, self.b_V)}[role]
        y = x.to(torch.float64) @ W  # (N, D) @ (H, D, d) -> (H, N, d)
        return y if b is None else y + b[:, None, :]

    def leaves(self) -> "LayerView":
        """Independent copies that require grad: an *untied* layer with the same weights."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in WEIGHTS:
            t = out[k]
            out[k] = None if t is None else t.detach().clone().requires_grad_()
        return LayerView(**{**out, "grad": True})

