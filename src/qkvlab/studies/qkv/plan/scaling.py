"""The gap against training budget and against size: the runs behind the scaling study.

Two families of cells, each a model size and a step count, every design of ``DESIGNS`` and
standard trained in it from scratch with its own full schedule (warm-up and cosine decay over
the cell's steps), on lm:

- **budget** cells: the profile's model (``d_model``, ``n_layers``, ``n_heads``) at each of
  ``scaling_budgets`` steps, on ``scaling_seeds``, with the attention-free control (``GATED``);
- **size** cells: each of ``size_widths`` × ``size_depths`` (``d_head`` the profile's, so
  ``n_heads`` grows with the width), trained on ``tokens_per_param`` tokens per non-embedding
  parameter of the standard model (Kaplan et al.'s count; the steps follow from the batch and
  the context, ``size_steps``), on ``size_seeds``, with the control too.

In either family a cell where standard does not beat the control by more than the margin is
one where attention is not yet used: the budget rule and the size fit read only the cells
where it is (``compute.scaling.used_budgets`` / ``used_sizes``), since a gap near zero there
says nothing about what a tie costs.

Learning rates are tuned per cell and design, apart from ``lr_tune``'s (keys ``(kind, d_model,
n_layers, steps, design)``, never a task's): experiment ``scaling_tune`` trains each at
``scaling_lr_grid`` × lm's rate on ``scaling_lr_seeds``; where the lowest mean validation loss
sits on the grid's edge, ``scaling_tune_edge`` follows it outward a grid step at a time
(``edges.follow_edge``: while the newest point wins, at most ``EDGE_STEPS`` points; a choice on
the last is flagged in the report). The rate is chosen on ``val_loss`` (validation); the
reported runs are scored on the test split (``compute.scaling.run_loss``). A diverged tuning run
counts as infinite loss; ties go to the smaller rate. Each stage's run list depends on the
finished results of the one before, so it raises ``ScalingPending`` until they are in the store
(``sweep`` trains the stages in order).

At a profile without these sizes every experiment here returns no runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from qkvlab.data import get_task
from qkvlab.experiments.registry import ResultsPending, Run, experiment, make_run
from qkvlab.experiments.store import run_id
from qkvlab.models import ModelConfig, config_params
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.edges import EDGE_STEPS, follow_edge, seed_mean
from qkvlab.studies.qkv.plan.rates import lr_of
from qkvlab.studies.qkv.plan.vocab import CONTROL
from qkvlab.studies.qkv.plan.vocab import DESIGNS as DESIGN_ROWS

TASK = "lm"
BASELINE = "standard"
# The tied designs, and GQA/MQA as the references of the same KV-cache saving.
DESIGNS = ("tied_kv", "tied_qk", "tied_qkv", "gqa_half", "mqa")
# The attention-free control (uniform scores) trains beside the budget cells: a budget where
# standard does not beat it by more than the margin is one where attention is not yet used, so
# a gap there says little about the ties (``compute.scaling.attention_by_budget``), so the
# budget rule compares the smallest budget where attention is used with the largest, and makes
# no test with fewer than two such budgets (``compute.scaling.budget_trend``); the size cells
# train it too, and the fit reads only the sizes where attention is used (at 20 tokens per
# parameter the smallest models train a few hundred steps, where it may not be).
GATED = (CONTROL,)
EXPERIMENTS = ("scaling_tune", "scaling_tune_edge", "scaling_budget", "scaling_size")
MIN_STEPS = 4  # a size cell never trains fewer steps
# evaluated at the end only: the budget axis is separate runs, not one run's curve, and five
# evaluations cost a short run ~15% of its time
EVAL_EVERY = 0


class ScalingPending(ResultsPending):
    """A scaling stage's runs depend on the finished tuning runs of the stage before."""


@dataclass(frozen=True)
class Cell:
    """One model size and step count: ``kind`` is ``budget`` or ``size``; ``n_params`` the
    standard model's non-embedding parameter count there."""

    kind: str
    d_model: int
    n_layers: int
    n_heads: int
    steps: int
    n_params: int
    held: bool = False  # a size cell held out of the tuning (``size_holdout``)

    def tags(self) -> dict[str, Any]:
        return {"cell": self.kind, "d_model": self.d_model, "n_layers": self.n_layers,
                "steps": self.steps, "cell_params": self.n_params}


def model_of(cell: Cell, design: str, p: QKVProfile) -> dict[str, Any]:
    """Model options of ``design`` in ``cell`` (GQA's and MQA's kv heads follow its heads)."""
    cp = dataclasses.replace(p, d_model=cell.d_model, n_layers=cell.n_layers,
                             n_heads=cell.n_heads)
    return {"d_model": cell.d_model, "n_layers": cell.n_layers, "n_heads": cell.n_heads,
            **DESIGN_ROWS[design].model_options(cp)}


def non_embedding(d_model: int, n_layers: int, n_heads: int) -> int:
    """Non-embedding parameters of the standard decoder (independent of vocabulary and context,
    so placeholders stand for them)."""
    cfg = ModelConfig(d_vocab=64, n_ctx=64, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    return int(config_params(cfg, "decoder")["non_embedding"])


def tokens_per_step(p: QKVProfile) -> int:
    """Tokens one training step predicts: the batch times lm's context."""
    return p.batch_size * int(get_task(TASK, **p.task_options.get(TASK, {})).seq_len)


def size_steps(p: QKVProfile, n_params: int) -> int:
    """Steps that train ``n_params`` non-embedding parameters on ``tokens_per_param`` tokens
    each (at least ``MIN_STEPS``)."""
    return max(MIN_STEPS, round(p.tokens_per_param * n_params / tokens_per_step(p)))


def cells(p: QKVProfile) -> list[Cell]:
    """Every budget and size cell of the profile (none where it does not size them)."""
    out = []
    n = non_embedding(p.d_model, p.n_layers, p.n_heads)
    if p.scaling_seeds:
        out += [Cell("budget", p.d_model, p.n_layers, p.n_heads, s, n)
                for s in p.scaling_budgets]
    d_head = p.d_model // p.n_heads
    if p.size_seeds:
        for width, depth, held in [(w, d, False) for d in p.size_depths for w in p.size_widths] \
                + [(w, d, True) for w, d in p.size_holdout]:
            heads = max(1, width // d_head)
            m = non_embedding(width, depth, heads)
            out.append(Cell("size", width, depth, heads, size_steps(p, m), m, held))
    return out


def donor(p: QKVProfile, cell: Cell) -> Cell:
    """The tuned cell whose rates a held-out cell trains at: the largest tuned size cell of its
    depth, else the largest tuned size cell (``cell`` itself where it is tuned)."""
    if not cell.held:
        return cell
    tuned = [c for c in cells(p) if c.kind == "size" and not c.held]
    same = [c for c in tuned if c.n_layers == cell.n_layers] or tuned
    return max(same, key=lambda c: c.n_params)


def lr_grid(p: QKVProfile) -> list[float]:
    return sorted({lr_of(TASK, m, p) for m in p.scaling_lr_grid})


def beyond(p: QKVProfile, lr: float, k: int = 1) -> float | None:
    """The point ``k`` grid steps past ``lr`` if it is an edge of the grid, else None."""
    grid, mults = lr_grid(p), sorted(p.scaling_lr_grid)
    if len(mults) < 2:
        return None
    step = mults[1] / mults[0] if lr == grid[0] else mults[-1] / mults[-2]
    if lr == grid[0]:
        return float(f"{lr / step ** k:.3g}")
    return float(f"{lr * step ** k:.3g}") if lr == grid[-1] else None


def tune_run(p: QKVProfile, cell: Cell, design: str, lr: float, seed: int) -> Run:
    # chosen on validation: a tuning run is never scored on the test split
    return make_run(TASK, model_of(cell, design, p), p, seed,
                    {"design": design, **cell.tags(), "lr": lr}, steps=cell.steps,
                    train={"lr": lr, "eval_every": EVAL_EVERY, "test_batches": 0})


def pick(by_lr: dict[float, list[float]]) -> float | None:
    """The rate with the lowest mean loss (diverged: inf); ties to the smaller; None if every
    rate diverged."""
    means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
    best = min(sorted(means), key=lambda lr: means[lr])
    return best if math.isfinite(means[best]) else None


def _losses(p: QKVProfile, runs: list[Run]) -> dict[tuple, dict[float, list[float | None]]]:
    """Validation losses of ``runs`` per (cell, design) and rate from the store's statuses
    (``p.rates.scaling_tuned``): infinite where a run diverged, None while it has not
    finished."""
    known = p.rates.scaling_tuned or {}
    out: dict[tuple, dict[float, list[float | None]]] = {}
    for spec, tags in runs:
        status, loss = known.get(run_id(spec.to_dict()), (None, None))
        ok = status == "done" and loss is not None and math.isfinite(loss)
        key = (tags["cell"], tags["d_model"], tags["n_layers"], tags["steps"], tags["design"])
        out.setdefault(key, {}).setdefault(float(tags["lr"]), []).append(
            None if status not in ("done", "diverged") else loss if ok else math.inf)
    return out


def _followed(p: QKVProfile) -> dict[tuple, tuple[list[float], float | None]]:
    """Per (cell kind, d_model, n_layers, steps, design): the points past the grid's edge to
    train and the choice (``edges.follow_edge`` from the grid's ``pick``; no points and None
    where every grid rate diverged; None while a point has not finished).

    Raises:
        ScalingPending: the grid has not finished.
    """
    tuned = grid_runs(p)
    grid = _losses(p, tuned)
    if any(None in v for by in grid.values() for v in by.values()):
        raise ScalingPending(f"profile {p.name}: the scaling learning-rate grid has not "
                             f"finished; run `qkvlab sweep scaling_tune --profile {p.name}`")
    best = {k: pick(by) for k, by in grid.items()}
    extra = [tune_run(p, c, d, lr, s) for c, d in _cell_design(p)
             if (b := best.get((c.kind, c.d_model, c.n_layers, c.steps, d))) is not None
             for k in range(1, EDGE_STEPS + 1) if (lr := beyond(p, b, k)) is not None
             for s in p.scaling_lr_seeds]
    losses = _losses(p, tuned + extra)
    return {k: (follow_edge(b, lambda n, b=b: beyond(p, b, n),
                            lambda lr, by=losses.get(k, {}): seed_mean(by.get(lr)))
                if b is not None else ([], None)) for k, b in best.items()}


def _cell_design(p: QKVProfile, held: bool = False):
    """Every (cell, design) the tuning covers; with ``held`` the held-out cells too."""
    for cell in cells(p):
        if held or not cell.held:
            for design in (BASELINE, *DESIGNS, *GATED):
                yield cell, design


def grid_runs(p: QKVProfile) -> list[Run]:
    return [tune_run(p, c, d, lr, s) for c, d in _cell_design(p) for lr in lr_grid(p)
            for s in p.scaling_lr_seeds]


def edge_runs(p: QKVProfile) -> list[Run]:
    """The points past the edge that ``edges.follow_edge`` has reached for each (cell,
    design) whose grid choice sits on it.

    Raises:
        ScalingPending: the grid has not finished.
    """
    followed = _followed(p)
    return [tune_run(p, c, d, lr, s) for c, d in _cell_design(p)
            for lr in followed.get((c.kind, c.d_model, c.n_layers, c.steps, d), ([], None))[0]
            for s in p.scaling_lr_seeds]


def chosen(p: QKVProfile) -> dict[tuple, float | None]:
    """``{(cell kind, d_model, n_layers, steps, design): rate}`` over the grid and the points
    past its edge (None: every rate diverged).

    Raises:
        ScalingPending: a tuning run has not finished.
    """
    if not p.scaling_lr_grid:
        return {}
    followed = _followed(p)
    if any(pts and lr is None for pts, lr in followed.values()):
        raise ScalingPending(f"profile {p.name}: the scaling grid's edge points have not "
                             f"finished; run `qkvlab sweep scaling_tune_edge --profile {p.name}`")
    return {k: lr for k, (_, lr) in followed.items()}


def main_runs(p: QKVProfile, kind: str, seeds: tuple[int, ...]) -> list[Run]:
    """Standard and every design in each ``kind`` cell on ``seeds``, each at its chosen rate
    (the task's rate where the profile tunes none, or where every tuned rate diverged: then at
    the grid's smallest); a held-out size cell at its ``donor``'s."""
    todo = [(c, d) for c, d in _cell_design(p, held=True) if c.kind == kind]
    if not todo:
        return []
    rates = chosen(p)
    out = []
    for c, d in todo:
        t = donor(p, c)  # a held-out cell: the rate its donor chose
        key = (t.kind, t.d_model, t.n_layers, t.steps, d)
        lr = rates.get(key) or (lr_grid(p)[0] if p.scaling_lr_grid else lr_of(TASK, 1.0, p))
        for seed in seeds:
            out.append(make_run(TASK, model_of(c, d, p), p, seed,
                                {"design": d, **c.tags(), "lr": lr}, steps=c.steps,
                                train={"lr": lr, "eval_every": EVAL_EVERY}))
    return out


@experiment("scaling_tune", "Q2–Q3 at scale: each design's learning rate per budget and size")
def scaling_tune(p: QKVProfile) -> list[Run]:
    return grid_runs(p) if p.scaling_lr_grid else []


@experiment("scaling_tune_edge", "Q2–Q3 at scale: the rate grid extended where the choice sits "
                                 "on its edge")
def scaling_tune_edge(p: QKVProfile) -> list[Run]:
    return edge_runs(p) if p.scaling_lr_grid and cells(p) else []


@experiment("scaling_budget", "Q2–Q3 at scale: does each tie's gap shrink with training?")
def scaling_budget(p: QKVProfile) -> list[Run]:
    return main_runs(p, "budget", p.scaling_seeds)


@experiment("scaling_size", "Q2–Q3 at scale: the gap against parameters at matched data, and "
                            "its prediction at 300M and 1.2B")
def scaling_size(p: QKVProfile) -> list[Run]:
    return main_runs(p, "size", p.size_seeds)


def tuned_status(store, profile: str) -> dict[str, tuple[str, float | None]]:
    """run id -> (status, final val loss) of the profile's scaling tuning runs in ``store``."""
    out = {}
    for name in EXPERIMENTS[:2]:
        for r in store.runs(name, profile):
            out[r["id"]] = (r["status"], (r["final"] or {}).get("val_loss"))
    return out
