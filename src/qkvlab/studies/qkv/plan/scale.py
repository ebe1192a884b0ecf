"""Q1's scale in training: where 1/√d_k must sit, decided on lm's loss, not on statistics at
init (experiment ``scale_probe``, the mechanism).

``scale_train`` trains lm with the scale at each placement of ``placements.PLACEMENTS`` (inside,
the baseline tagged ``standard``; outside; both; none; none with T5's init) at each head width
of ``scale_train_d_heads`` split so that heads × d_head = d_model, from each initialization of
``placements.SCALE_INITS`` (the model's own std 0.02, and unit variance), on
``scale_train_seeds``, and the attention-free control at each width (the gate of
``compute.effects``). At a profile with a learning-rate grid each (placement, d_head, init), the
control's per d_head too, trains at its own rate, chosen by ``scale_tune``
(``rates.placement_tuning_runs``) on the tuning seeds' val loss, the grid followed outward by
``scale_tune_edge`` where that choice sits on its edge (``edges.follow_edge``). Without a grid
every run trains at lm's rate. The verdicts (each placement vs inside from the same init at each
d_head, on lm's own metric) are Q1's headline cells (``families``).
"""

from __future__ import annotations

from qkvlab.experiments.registry import Run, experiment
from qkvlab.studies.qkv.plan.placements import (
    PLACEMENTS,
    SCALE_INITS,
    control_run,
    placement_run,
)
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.rates import (
    RatesPending,
    placement_edge_runs,
    placement_tuning_runs,
)
from qkvlab.studies.qkv.plan.vocab import CONTROL


def placement_lr(p: QKVProfile, tag: str, d_head: int, init: str = SCALE_INITS[0]
                 ) -> float | None:
    """The rate a placement (or the control, from the model's own init) trains at, at one
    width and init: ``scale_tune``'s choice with a grid, else None (lm's rate).

    Raises:
        RatesPending: the profile tunes rates and ``scale_tune`` has not chosen this one yet.
    """
    if not p.lr_grid:
        return None
    key = ("lm", tag, "equal", d_head, init)
    if key not in (p.rates.lrs or {}):
        raise RatesPending(
            f"profile {p.name}: scale_train trains each placement of 1/sqrt(d_k) at the rate "
            f"experiments scale_tune and scale_tune_edge chose at its d_head and init, and "
            f"they have not finished for {tag} at d_head {d_head} from the {init} init; run "
            f"`qkvlab sweep scale_tune --profile {p.name}`, then scale_tune_edge, first "
            f"(qkvlab study does)")
    return p.rates.lrs[key]


@experiment("scale_tune", "Q1: each placement of 1/sqrt(d_k) at its own learning rate, per "
                          "d_head")
def scale_tune(p: QKVProfile) -> list[Run]:
    return placement_tuning_runs(p)


@experiment("scale_tune_edge", "Q1: the placements' rate grid followed outward (up to 3 "
                               "steps) where the choice sits on its edge")
def scale_tune_edge(p: QKVProfile) -> list[Run]:
    return placement_edge_runs(p)


@experiment("scale_train", "Q1: does 1/sqrt(d_k) need to sit inside the softmax? lm loss per "
                           "placement and d_head, each at its own rate")
def scale_train(p: QKVProfile) -> list[Run]:
    rates = {(tag, d, i): placement_lr(p, tag, d, i) for d in p.scale_train_d_heads
             for i in SCALE_INITS for tag in PLACEMENTS}
    control = {d: placement_lr(p, CONTROL, d) for d in p.scale_train_d_heads}
    runs = []
    for seed in p.scale_train_seeds:
        for d_head in p.scale_train_d_heads:
            runs += [placement_run(p, tag, d_head, seed, {}, rates[(tag, d_head, i)], init=i)
                     for i in SCALE_INITS for tag in PLACEMENTS]
            runs.append(control_run(p, d_head, seed, {}, control[d_head]))
    return runs
