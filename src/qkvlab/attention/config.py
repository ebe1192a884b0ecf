"""Configuration of one attention layer, validated on construction.

Shape legend used across ``qkvlab.attention``:
    B batch, Tq query length, Tk key/value length, D d_model,
    H n_heads (query heads), G n_kv_heads (key/value heads), dk d_head, dv d_v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qkvlab import typed

from qkvlab.attention.registry import DESIGNS

SCALES = ("inside", "outside", "both", "none")
MIX_INITS = ("random", "identity")


@dataclass(frozen=True)
class AttentionConfig:
    """Sizes and options of one multi-head attention layer.

    Args:
        d_model: width of the residual stream (queries, and keys/values unless ``d_source``).
        n_heads: number of query heads H.
        design: registered design name (see ``qkvlab.attention.DESIGNS``).
        d_head: query/key width per head dk (default ``d_model // n_heads``).
        d_v: value width per head dv (default ``d_head``).
        n_kv_heads: key/value heads G for GQA (G = 1 is MQA; default H).
        scale: where 1/sqrt(dk) sits: ``inside`` the softmax, ``outside`` (on the output),
            ``both`` or ``none``; default is the design's own (``standard`` inside, ``alt`` both).
        bias: biases on the projections and on W_O.
        dropout: dropout probability on the attention weights (training only).
        self_mask: a query may not attend to its own position unless it has no other
            target (Reformer); only for designs with Q = K.
        mix_init: initial per-head mixing matrix of designs that have one (``alt``'s W_h):
            ``random`` (variance-preserving) or ``identity`` (W_h = I / outer scale, so the
            layer computes exactly what ``standard`` computes with the same other weights).

    Raises:
        ValueError: naming the field and the allowed values.
    """

    d_model: int
    n_heads: int
    design: str = "standard"
    d_head: int | None = None
    d_v: int | None = None
    n_kv_heads: int | None = None
    scale: str | None = None
    bias: bool = False
    dropout: float = 0.0
    self_mask: bool = False
    mix_init: str = "random"

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads"):
            _positive_int(name, getattr(self, name))
        for name in ("d_head", "d_v", "n_kv_heads"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.design not in DESIGNS:
            raise ValueError(f"design: unknown design {self.design!r}; allowed: {sorted(DESIGNS)}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "choose d_model = n_heads * d_head or set d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_v is None:
            object.__setattr__(self, "d_v", self.d_head)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads: n_heads={self.n_heads} is not divisible by "
                f"n_kv_heads={self.n_kv_heads}"
            )
        if self.scale is None:
            object.__setattr__(self, "scale", DESIGNS[self.design].default_scale)
        if self.scale not in SCALES:
            raise ValueError(f"scale: {self.scale!r} is not one of {list(SCALES)}")
        typed.check_number(self.dropout, "dropout", 0.0, 1.0, hi_open=True)
        if self.mix_init not in MIX_INITS:
            raise ValueError(f"mix_init: {self.mix_init!r} is not one of {list(MIX_INITS)}")
        DESIGNS[self.design].check_config(self)

    @property
    def inner_scale(self) -> float:
        """Factor on the scores inside the softmax."""
        return 1.0 / math.sqrt(self.d_head) if self.scale in ("inside", "both") else 1.0

    @property
    def outer_scale(self) -> float:
        """Factor on the attention output, after the softmax."""
        return 1.0 / math.sqrt(self.d_head) if self.scale in ("outside", "both") else 1.0

    def replace(self, **changes) -> AttentionConfig:
        return typed.replace(self, **changes)


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {value!r} must be a positive integer")
