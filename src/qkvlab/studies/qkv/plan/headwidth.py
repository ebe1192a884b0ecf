"""The head-width axis of K = V, written down before its runs (issue 39, item 3): does the
tie's cost on lm fall as each head widens? d_head is 16 in the study's lm, 64 in Kayyam et
al.'s models and 256-512 in Gemma's K = V layers, and a head of width d_head must carry both
what it matches and what it returns through one projection when K = V.

The cells (``head_width_cells``): (d_model, n_heads) with n_heads × d_head = d_model, depth
and everything else the profile's lm, so the width of the residual stream and the parameters
of every projection stay fixed while the heads split them differently (at d_model 64: 8×8,
4×16, 2×32, 1×64; at 128: 2×64, d_head 64 at twice the width). Per cell, at equal width:

- standard, tied K = V and GQA-half (the same KV cache as K = V; not at one head, where it
  is standard), and the attention-free control, each on the profile's seeds;
- each at its own rate where the profile tunes rates: experiment ``head_width_tune`` trains
  every (cell, design) at ``lr_grid`` × lm's rate on ``lr_seeds`` (scored on val only),
  ``head_width_tune_edge`` follows a choice on the grid's edge outward (``edges.follow_edge``,
  grid steps of ``rates.grid_edge``), and the choice is ``rates.edge_choices``' (lowest mean
  val loss, a lost run infinite, ties to the smaller rate), as lr_tune's. The profile's own cell is
  lr_tune's: the same specs, so the same runs and the same choices, and lm_tied_kv's,
  lm_gqa's and its control's reported runs serve it unchanged.

The comparisons (``compute.headwidth``), on the test split: per cell, each design against
standard paired by seed in % perplexity per token with lm's margin, the family of every
design × cell Holm-corrected, each cell read only where standard beats its control there.
The trend (``TREND``): per seed, the least-squares slope of K = V's log-perplexity gap on
log2(d_head) over the cells at the profile's width; its mean over seeds with a 95% t
interval, in % per doubling of d_head, reads "falls" (interval below 0), "grows" (above 0),
"flat" (inside ±``FLAT_PER_DOUBLING``) or undecided.
"""

from __future__ import annotations

import dataclasses
import math

from qkvlab.experiments.ids import run_id
from qkvlab.experiments.registry import Run, design_arms
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.edges import EDGE_STEPS
from qkvlab.studies.qkv.plan.rates import (
    RatesPending,
    edge_choices,
    grid_choices,
    grid_edge,
    lr_of,
    tuning_run,
)
from qkvlab.studies.qkv.plan.vocab import CONTROL, DESIGNS

TASK = "lm"
DESIGNS_HW = ("tied_kv", "gqa_half")  # compared with standard in every cell
TREND = "tied_kv"  # the design whose trend with d_head the answer reads
# "flat": the slope's interval inside ±0.5% per doubling, so at most ±1.5% over the width-64
# cells' three doublings (8 to 64): within lm's ±1% margin at either end, give or take half.
FLAT_PER_DOUBLING = 0.5


def cells(p: QKVProfile) -> tuple[tuple[int, int], ...]:
    """(d_model, n_heads) of each cell, the profile's own included where it lists it."""
    return tuple(p.head_width_cells)


def d_head(cell: tuple[int, int]) -> int:
    return cell[0] // cell[1]


def check(p: QKVProfile) -> None:
    """Raises ValueError where a cell does not split its width into whole heads."""
    bad = [c for c in cells(p) if c[1] < 1 or c[0] % c[1]]
    if bad:
        raise ValueError(f"profile {p.name}: head_width_cells {bad}: n_heads must divide "
                         f"d_model")


def at(p: QKVProfile, cell: tuple[int, int]) -> QKVProfile:
    """The profile with the cell's width and heads (depth and all else the profile's)."""
    return dataclasses.replace(p, d_model=cell[0], n_heads=cell[1])


def designs(cell: tuple[int, int]) -> tuple[str, ...]:
    """The designs compared in a cell: GQA-half needs two heads to share a kv head."""
    return tuple(d for d in DESIGNS_HW if d != "gqa_half" or cell[1] > 1)


def _tags(cell: tuple[int, int]) -> dict:
    return {"d_model": cell[0], "n_heads": cell[1], "d_head": d_head(cell)}


def tuning_runs(p: QKVProfile, only: dict | None = None) -> list[Run]:
    """``head_width_tune``'s runs: every (cell, design) and the control at every grid point on
    the tuning seeds, scored on val only (none without a grid). ``only``: {(design, d_model,
    n_heads): rates}, those rates alone (the edge's)."""
    if not (p.lr_grid and cells(p)):
        return []
    check(p)
    out = []
    for cell in cells(p):
        pc = at(p, cell)
        for d in ("standard", *designs(cell), CONTROL):
            if only is not None and (d, *cell) not in only:
                continue
            lrs = (only[(d, *cell)] if only is not None else
                   [lr_of(TASK, m, p) for m in p.lr_grid])
            for lr in lrs:
                for seed in p.lr_seeds:
                    spec, tags = tuning_run(pc, TASK, d, "equal", lr, seed)
                    out.append((spec, {**tags, **_tags(cell)}))
    return out


def _rows(p: QKVProfile, runs: list[Run]) -> list[tuple]:
    """``rates.choose_lrs``' rows of ``runs``, keyed (task, design, arm, d_model, n_heads), from
    the statuses and val losses read into ``p.rates.stored``."""
    stored = p.rates.stored or {}
    return [(t["task"], t["design"], t["arm"], t["lr"], *stored.get(run_id(s), (None, None)),
             t["d_model"], t["n_heads"]) for s, t in runs]


def _keys(p: QKVProfile) -> list[tuple]:
    return [(TASK, d, "equal", *cell) for cell in cells(p)
            for d in ("standard", *designs(cell), CONTROL)]


def _pending(p: QKVProfile, what: str, missing: list[tuple]) -> RatesPending:
    names = ", ".join(f"{d} at {m}×{h}" for _, d, _, m, h in missing[:4])
    more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
    return RatesPending(f"profile {p.name}: the head-width cells train each design at the rate "
                        f"{what} chose, and it has not chosen {names}{more}; run `qkvlab sweep "
                        f"{what} --profile {p.name}` first (qkvlab study does)")


def _followed(p: QKVProfile) -> tuple[dict[tuple, float], dict[tuple, tuple]]:
    """``rates.edge_choices``' final choices and points past the edge, keyed as ``_keys``.

    Raises:
        RatesPending: ``head_width_tune`` has not finished.
    """
    grid = tuning_runs(p)
    base, _ = grid_choices(p, _rows(p, grid), math.nan)
    missing = [k for k in _keys(p) if k not in base]
    if missing:
        raise _pending(p, "head_width_tune", missing)
    cands = {k[1:2] + k[3:]: tuple(lr for n in range(1, EDGE_STEPS + 1)
                                   if (lr := grid_edge(p, TASK, base[k], n)) is not None)
             for k in _keys(p)}
    _, final, points = edge_choices(p, _rows(p, grid + tuning_runs(p, cands)), math.nan)
    return final, points


def edge_runs(p: QKVProfile) -> list[Run]:
    """``head_width_tune_edge``'s runs: past each choice on the grid's edge, the points
    ``edges.follow_edge`` has reached.

    Raises:
        RatesPending: ``head_width_tune`` has not finished.
    """
    if not tuning_runs(p):
        return []
    _, points = _followed(p)
    beyond = {k[1:2] + k[3:]: points[k] for k in _keys(p) if points.get(k)}
    return tuning_runs(p, beyond) if beyond else []


def chosen(p: QKVProfile) -> dict[tuple, float]:
    """{(design, d_model, n_heads): rate}: the grid's choice, or over the grid and the points
    past its edge; empty without a grid (every design at lm's rate).

    Raises:
        RatesPending: the tuning runs have not all finished.
    """
    if not tuning_runs(p):
        return {}
    final, _ = _followed(p)
    missing = [k for k in _keys(p) if k not in final]
    if missing:
        raise _pending(p, "head_width_tune_edge", missing)
    return {k[1:2] + k[3:]: final[k] for k in _keys(p)}


def reported_runs(p: QKVProfile) -> list[Run]:
    """``head_width``'s runs: per cell, standard, its designs and the control on the seeds at
    their chosen rates, tagged with the cell."""
    if not cells(p):
        return []
    check(p)
    lrs = chosen(p)
    out = []
    for cell in cells(p):
        pc = at(p, cell)
        labels = designs(cell)
        rates = {(d, "equal"): lrs[(d, *cell)] for d in ("standard", *labels, CONTROL)
                 if (d, *cell) in lrs}
        runs = design_arms(TASK, pc, {d: DESIGNS[d].model_options(pc) for d in labels},
                           arms=("equal",), lrs=rates)
        runs += [r for r in design_arms(TASK, pc, {CONTROL: DESIGNS[CONTROL].model_options(pc)},
                                        arms=("equal",), lrs=rates)
                 if r[1]["design"] == CONTROL]
        out += [(spec, {**tags, **_tags(cell)}) for spec, tags in runs]
    return out
