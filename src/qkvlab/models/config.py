"""One frozen config for every model, with the attention design chosen per role.

Roles: ``encoder`` (bidirectional self-attention), ``decoder`` (causal self-attention) and
``cross`` (decoder queries, encoder keys/values). ``roles`` overrides any attention option
for one role, e.g. ``roles={"cross": {"design": "tied_kv"}}``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qkvlab import typed
from qkvlab.attention import AttentionConfig
from qkvlab.inputs import BOUNDS

ROLES = ("encoder", "decoder", "cross")
POSITIONS = ("learned", "rotary")
ACTIVATIONS = ("gelu_tanh", "gelu")  # GPT-2's tanh approximation; exact GELU
# Attention options a role may override (the rest of AttentionConfig follows the model).
ROLE_OPTIONS = ("design", "scale", "self_mask", "n_kv_heads", "d_head", "d_v", "mix_init")
# Upper bound of each size (the kind of bound in qkvlab.inputs.BOUNDS, with its reason there): a
# config read from a file cannot ask for a model no machine holds before anything checks it.
SIZE_BOUNDS = {"d_vocab": "vocab", "n_ctx": "context", "d_model": "width", "n_layers": "layers",
               "n_heads": "heads", "d_head": "width", "d_v": "width"}
# The number options and their intervals (lo, hi, lo_open, hi_open), checked where a config is
# made and in a RunSpec's model options (``check_numbers``), so a NaN or an out-of-range value
# is one error naming its field before anything is built, not a failure deep inside a run.
NUMBERS = {"dropout": (0.0, 1.0, False, True), "attn_dropout": (0.0, 1.0, False, True),
           "rope_base": (0.0, math.inf, True, False), "init_std": (0.0, math.inf, False, False)}


def check_numbers(options: Mapping[str, Any], where: str = "") -> None:
    """The number options present in ``options`` are finite and in their intervals.

    Raises:
        ValueError: ``model.dropout: nan is not a finite number in [0, 1)`` (``where`` first).
    """
    for name, (lo, hi, lo_open, hi_open) in NUMBERS.items():
        if name in options:
            typed.check_number(options[name], f"{where}.{name}" if where else name, lo, hi,
                               lo_open=lo_open, hi_open=hi_open)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and options of a DecoderLM, Encoder or EncoderDecoder.

    ``d_head`` defaults to ``d_model // n_heads``; ``d_mlp`` to ``4 * d_model``.
    ``n_layers`` counts the blocks of each stack (encoder and decoder alike).
    ``activation``: the MLP's GELU, ``gelu_tanh`` (GPT-2) or ``gelu`` (exact).
    """

    d_vocab: int
    n_ctx: int
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_head: int | None = None
    d_v: int | None = None
    n_kv_heads: int | None = None
    d_mlp: int | None = None
    design: str = "standard"
    scale: str | None = None
    self_mask: bool = False
    mix_init: str = "random"
    roles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    bias: bool = True
    activation: str = "gelu_tanh"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    positions: str = "learned"
    rope_base: float = 10000.0
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx", "d_model", "n_layers", "n_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: {v!r} must be a positive integer")
            _bounded(name, v)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if not isinstance(self.d_mlp, int) or isinstance(self.d_mlp, bool) or self.d_mlp < 1:
            raise ValueError(f"d_mlp: {self.d_mlp!r} must be a positive integer")
        _bounded("d_mlp", self.d_mlp, 4)
        for name in ("bias", "self_mask", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: {getattr(self, name)!r} must be true or false")
        check_numbers({name: getattr(self, name) for name in NUMBERS})
        if self.positions not in POSITIONS:
            raise ValueError(f"positions: {self.positions!r} is not one of {list(POSITIONS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: {self.activation!r} is not one of {list(ACTIVATIONS)}")
        if not isinstance(self.roles, Mapping):
            raise ValueError(f"roles: {self.roles!r} must map a role to attention options")
        for role, opts in self.roles.items():
            if role not in ROLES:
                raise ValueError(f"roles: unknown role {role!r}; allowed: {list(ROLES)}")
            typed.check_keys(opts, ROLE_OPTIONS, f"roles.{role}")
        object.__setattr__(self, "roles", {r: dict(o) for r, o in self.roles.items()})
        for role in ROLES:  # validate every role's attention now, not at first forward
            att = self.attention(role)
            for name in ("d_head", "d_v"):
                _bounded(f"{'roles.' + role + '.' if role in self.roles else ''}{name}",
                         getattr(att, name))
        if self.positions == "rotary":
            for role in ROLES:
                if self.attention(role).d_head % 2:
                    raise ValueError(f"d_head: rotary positions need an even d_head "
                                     f"(role {role}: {self.attention(role).d_head})")

    def attention(self, role: str) -> AttentionConfig:
        """The ``AttentionConfig`` of one role (``encoder``, ``decoder`` or ``cross``)."""
        if role not in ROLES:
            raise ValueError(f"role: {role!r} is not one of {list(ROLES)}")
        opts = dict(design=self.design, scale=self.scale, self_mask=self.self_mask,
                    n_kv_heads=self.n_kv_heads, d_head=self.d_head, d_v=self.d_v,
                    mix_init=self.mix_init)
        opts.update(self.roles.get(role, {}))
        try:
            return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, bias=self.bias,
                                   dropout=self.attn_dropout, **opts)
        except ValueError as e:
            where = f"roles.{role}." if role in self.roles else ""
            raise ValueError(f"{where}{e}") from None

    def replace(self, **changes) -> ModelConfig:
        return typed.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        return typed.from_dict(cls, d)


def _bounded(name: str, value: int, times: int = 1) -> None:
    """``name`` (a size) at most ``times`` × its bound in ``qkvlab.inputs.BOUNDS``."""
    bound, why = BOUNDS[SIZE_BOUNDS.get(name.rsplit(".", 1)[-1], "width")]
    if value > times * bound:
        raise ValueError(f"{name}: {value:,} is above the limit of {times * bound:,} "
                         f"({why}{'; d_mlp: 4 times that' if times > 1 else ''})")
