"""Where 1/√d_k sits, as runs: the placements Q1's trained comparison (``scale.py``'s
``scale_train``) and its learning-rate grid (``rates.placement_tuning_runs``) build.

A placement is one lm model: ``inside`` (the scores divided by √d_k before the softmax: the
standard design, the comparison's baseline, tagged ``standard``), ``outside`` (the head output
divided instead: AttentionAlt's outer scale alone), ``both`` (AttentionAlt's), ``none``, and
``none_t5``: none, with 1/√d_k folded into W_Q's initialization (T5's remedy,
``InitConfig(qk="t5")``). Every placement starts from the model's own (GPT-2) init, the one
every other comparison trains from; only d_head changes across widths, with ``SCALE_HEADS``
heads at every width (as the scale probe), so the width the argument is about is the axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qkvlab.experiments.registry import Profile, Run, base_model, make_run
from qkvlab.train import InitConfig


@dataclass(frozen=True)
class Placement:
    """One placement: the design tag its runs carry, the attention ``scale`` option and the
    init of its query projection (``InitConfig.qk``)."""

    tag: str
    scale: str
    init: str = "gpt2"


PLACEMENTS: dict[str, Placement] = {p.tag: p for p in (
    Placement("standard", "inside"),  # the baseline: 1/√d_k inside the softmax
    Placement("outside", "outside"),
    Placement("both", "both"),
    Placement("none", "none"),
    Placement("none_t5", "none", "t5"),
)}
SCALE_HEADS = 2  # heads at every d_head (the scale probe's)


def placement_run(p: Profile, tag: str, d_head: int, seed: int, tags: dict[str, Any],
                  lr: float | None = None, train: dict[str, Any] | None = None) -> Run:
    """One lm run of placement ``tag`` at ``d_head`` (its rate ``lr``, else the task's;
    ``train``: other TrainConfig overrides)."""
    pl = PLACEMENTS[tag]
    model = base_model(p, n_heads=SCALE_HEADS, d_head=d_head, scale=pl.scale)
    init = InitConfig(qk=pl.init) if pl.init != "gpt2" else None
    return make_run("lm", model, p, seed,
                    {"design": tag, "arm": "equal", "d_head": d_head, "scale": pl.scale,
                     "init": pl.init, **tags},
                    train={**(train or {}), **({} if lr is None else {"lr": lr})} or None,
                    init=init)


def control_run(p: Profile, d_head: int, seed: int, tags: dict[str, Any],
                lr: float | None = None, train: dict[str, Any] | None = None) -> Run:
    """The attention-free control (``vocab.CONTROL``: uniform scores) at ``d_head``: the same
    model with no Q or K, so there is no scale to place."""
    model = base_model(p, n_heads=SCALE_HEADS, d_head=d_head, design="uniform")
    return make_run("lm", model, p, seed, {"design": "control", "arm": "equal",
                                           "d_head": d_head, **tags},
                    train={**(train or {}), **({} if lr is None else {"lr": lr})} or None)
