"""Uptrain a fitted K=V tie's output projection in the untied model's basis.

The fitted K=V start (:func:`qkvlab.hf.tie.fold_kv`) folds the map M of V ≈ K·M into each head's
output projection, W_O' = W_O·Mᵀ, and the attention's output W_O'·h then reads h = Σ aᵢ·kᵢ, the
keys themselves. Where the keys are far larger than the values were (Qwen2's k_proj biases reach
145-211), an Adam step, which moves every element of W_O' by about the rate whatever its
gradient, moves the output by the rate times those large inputs. On Qwen2.5-Coder-0.5B one such
step on W_O' at 3e-6 raised a batch's distillation loss from 2.80 to 12.1, where the same step
on the untied model's W_O lowered it (``scripts/uptrain-steps.py --sensitivity``,
docs/convert.md).

``o_basis="untied"`` trains W_O itself, with M fixed: W_O' is a parametrization
(``torch.nn.utils.parametrize``) of the untied W_O, so the step is taken where the untied model
takes it and reaches W_O' through Mᵀ. The function the student computes is the same (W_O·Mᵀ in
fp32 rather than folded in float64: equal to rounding); only the optimizer's geometry changes.
:func:`fold` makes it an ordinary weight again before the model is written.

    untie_output_basis(student, teacher, calibration)   # after tie(student, "kv", ...)
    fold(student)                                       # before writing it
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

O_BASES = ("tied", "untied")


def check(kind: str, start: str | None, o_basis: str) -> None:
    """Raise ValueError where ``o_basis`` is unknown, or "untied" for a tie and start that fold
    nothing into W_O (only K=V from the fitted start does)."""
    if o_basis not in O_BASES:
        raise ValueError(f"o_basis: {o_basis!r} is not one of {list(O_BASES)}")
    if o_basis == "untied" and (kind, start) != ("kv", "fitted"):
        raise ValueError(f"o_basis: 'untied' trains the W_O that K=V's fitted start folds its "
                         f"map into; tie {kind!r} from start {start!r} folds none (use 'tied')")


class FoldedOutput(nn.Module):
    """The parametrization W_O ↦ W_O·Mᵀ, head by head: W_O [d_model, n_heads·d_head],
    M [n_heads, d_head, d_head] (each q head's kv head's map), fixed and not saved."""

    def __init__(self, M: torch.Tensor):
        super().__init__()
        self.register_buffer("M", M, persistent=False)

    def forward(self, W: torch.Tensor) -> torch.Tensor:
        h, e = self.M.shape[:2]
        return torch.einsum("dhe,hfe->dhf", W.view(W.shape[0], h, e), self.M).reshape(W.shape)


def untie_output_basis(student: nn.Module, teacher: nn.Module, calibration) -> nn.Module:
    """Give each K=V layer of ``student`` (tied from the fitted start on ``calibration``, a
    :class:`qkvlab.hf.tie.Calibration`) the untied W_O of ``teacher`` as its trained parameter,
    with the fit's M fixed in a :class:`FoldedOutput`; returns ``student``."""
    from qkvlab.hf.tie import decoder_layers, fit_kv
    for i, (t, s) in enumerate(zip(decoder_layers(teacher), decoder_layers(student))):
        o = s.self_attn.o_proj
        n_heads = t.self_attn.config.num_attention_heads
        M = fit_kv(t.self_attn, calibration.moments[i])        # the fit tie() folded, float64
        M_h = M.repeat_interleave(n_heads // M.shape[0], 0).to(o.weight)
        with torch.no_grad():
            o.weight.copy_(t.self_attn.o_proj.weight)
        parametrize.register_parametrization(o, "weight", FoldedOutput(M_h))
    return student


def fold(model: nn.Module) -> nn.Module:
    """Every parametrized weight made an ordinary one again (W_O·Mᵀ computed once); in place."""
    for m in model.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    return model
