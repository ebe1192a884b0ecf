"""Where 1/√d_k sits, as runs: the placements Q1's trained comparison (``scale.py``'s
``scale_train``) and its learning-rate grid (``rates.placement_tuning_runs``) build.

A placement is one lm model: ``inside`` (the scores divided by √d_k before the softmax: the
standard design, the comparison's baseline, tagged ``standard``), ``outside`` (the head output
divided instead: AttentionAlt's outer scale alone), ``both`` (AttentionAlt's), ``none``, and
``none_t5``: none, with 1/√d_k folded into W_Q's initialization (T5's remedy). Each is trained
at every head width of the profile's ``scale_train_d_heads`` with ``d_model // d_head`` heads,
so heads × d_head = d_model and only how the width is split changes (not the value path's
width), and from each initialization of ``SCALE_INITS``: the model's own (GPT-2's std 0.02,
which keeps the scores near zero at any d_head, so the saturation 1/√d_k prevents never
arises) and a unit-variance one (W_Q, W_K, W_V from N(0, 1/d_model): a raw score then has
variance d_k, the regime the argument for 1/√d_k is made in). Runs carry the init as tag
``init``, so each placement is compared with inside from the same init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qkvlab.experiments.registry import Profile, Run, base_model, make_run
from qkvlab.train import InitConfig


@dataclass(frozen=True)
class Placement:
    """One placement: the design tag its runs carry, the attention ``scale`` option and
    whether W_Q's init is divided by √d_head (T5's remedy, ``InitConfig`` ``t5``/``unit_t5``)."""

    tag: str
    scale: str
    t5: bool = False


PLACEMENTS: dict[str, Placement] = {p.tag: p for p in (
    Placement("standard", "inside"),  # the baseline: 1/√d_k inside the softmax
    Placement("outside", "outside"),
    Placement("both", "both"),
    Placement("none", "none"),
    Placement("none_t5", "none", t5=True),
)}
# The initializations each placement trains from: the model's own, then unit variance.
SCALE_INITS = ("gpt2", "unit")
# each init in words (the report's)
INIT_WORDS = {"gpt2": "the model's own init (std 0.02)",
              "unit": "a unit-variance init (std 1/√d_model)"}
# ``InitConfig.qk`` per (init, T5's remedy); None: the model's own init
INIT_QK = {("gpt2", False): None, ("gpt2", True): "t5", ("unit", False): "unit",
           ("unit", True): "unit_t5"}


def scale_heads(p: Profile, d_head: int) -> int:
    """The heads at ``d_head``: ``d_model // d_head``, so heads × d_head = d_model.

    Raises:
        ValueError: ``d_head`` does not divide the profile's ``d_model``.
    """
    if d_head <= 0 or p.d_model % d_head:
        raise ValueError(f"profile {p.name}: scale_train_d_heads: {d_head} does not divide "
                         f"d_model {p.d_model} (heads × d_head must equal d_model)")
    return p.d_model // d_head


def placement_run(p: Profile, tag: str, d_head: int, seed: int, tags: dict[str, Any],
                  lr: float | None = None, train: dict[str, Any] | None = None,
                  init: str = "gpt2") -> Run:
    """One lm run of placement ``tag`` at ``d_head`` (``scale_heads`` heads) from ``init`` (one
    of ``SCALE_INITS``), at its rate ``lr``, else the task's; ``train``: other TrainConfig
    overrides."""
    pl = PLACEMENTS[tag]
    model = base_model(p, n_heads=scale_heads(p, d_head), d_head=d_head, scale=pl.scale)
    qk = INIT_QK[(init, pl.t5)]
    return make_run("lm", model, p, seed,
                    {"design": tag, "arm": "equal", "d_head": d_head,
                     "n_heads": scale_heads(p, d_head), "scale": pl.scale, "init": init, **tags},
                    train={**(train or {}), **({} if lr is None else {"lr": lr})} or None,
                    init=None if qk is None else InitConfig(qk=qk))


def control_run(p: Profile, d_head: int, seed: int, tags: dict[str, Any],
                lr: float | None = None, train: dict[str, Any] | None = None) -> Run:
    """The attention-free control (``vocab.CONTROL``: uniform scores) at ``d_head``: the same
    model with no Q or K, so there is no scale to place and no init of theirs to vary. Tagged
    with the model's own init (``gpt2``): its row is then read against inside from that init,
    and that reading gates every init's rows at this width (does attention pay at this
    budget), ``results.CONTROL_KEYS``."""
    model = base_model(p, n_heads=scale_heads(p, d_head), d_head=d_head, design="uniform")
    return make_run("lm", model, p, seed, {"design": "control", "arm": "equal",
                                           "d_head": d_head, "n_heads": scale_heads(p, d_head),
                                           "init": SCALE_INITS[0], **tags},
                    train={**(train or {}), **({} if lr is None else {"lr": lr})} or None)
