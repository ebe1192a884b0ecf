"""Q1's scale in training (experiment ``scale_train``), from ``results.StudyData``: each
placement of 1/√d_k vs inside (standard) at each head width and init on lm's own metric, the
rates they trained at, the grid those were chosen on (``scale_tune``), and the answer record
(one per init) ``render.scale`` words. The verdicts are the comparison rows' own
(``effects.effect`` on rows that carry Q1's Holm correction and the control's gate): nothing
is re-tested here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from qkvlab.stats import mean_ci
from qkvlab.studies.qkv.compute.effects import Effect, Status, effect, finite
from qkvlab.studies.qkv.compute.frames import diffs, probe_at
from qkvlab.studies.qkv.compute.results import StudyData, row_chance
from qkvlab.studies.qkv.plan.placements import PLACEMENTS, SCALE_INITS
from qkvlab.studies.qkv.plan.rates import placement_choices
from qkvlab.studies.qkv.plan.vocab import CONTROL, TASK_METRIC

PLACED = tuple(t for t in PLACEMENTS if t != "standard")  # compared against inside
EFFECT_COLUMNS = ["init", "design", "d_head", "value", "lo", "hi", "status", "raw_status", "n",
                  "lost", "baseline_lost", "p", "p_adj", "family_m", "mean", "baseline_mean",
                  "unit"]


def reported() -> str:
    """The metric scale_train's verdicts, table and figure report: lm's own (the one place
    that names it). Its comparison rows are scored on the test split (``results.comparisons``
    reads ``vocab.reported``); the tuning grid reads val loss, where rates are chosen."""
    return TASK_METRIC["lm"]


def placement_rows(data: StudyData) -> list[dict]:
    """scale_train's comparison rows (placement vs inside) on the ``reported`` metric."""
    c = diffs(data.compared("scale_train", metric=reported()))
    return c[c.design.isin(PLACED)].to_dict("records") if not c.empty else []


def placement_effects(data: StudyData) -> pd.DataFrame:
    """One row per (init, placement, d_head): its corrected verdict and effect vs inside from
    the same init (value, lo, hi in the metric's display unit; the difference is drawn even
    where there is no verdict), the seeds it rests on and lost, p and Holm's p, and both
    sides' mean."""
    rows = []
    for r in placement_rows(data):
        e, raw = effect(r, chance=row_chance(r, data.profile)), effect(r)
        rows.append({"init": r["init"], "design": r["design"], "d_head": int(r["d_head"]),
                     "value": raw.value,
                     "lo": raw.lo, "hi": raw.hi, "status": e.status.value,
                     "raw_status": e.raw_status.value if e.raw_status else None, "n": raw.n,
                     "lost": raw.lost, "baseline_lost": raw.baseline_lost, "p": raw.p,
                     "p_adj": raw.p_adj, "family_m": raw.family_m, "mean": r.get("mean"),
                     "baseline_mean": r.get("baseline_mean"), "unit": raw.unit})
    df = pd.DataFrame(rows, columns=EFFECT_COLUMNS)
    order = {"design": {t: i for i, t in enumerate(PLACED)},
             "init": {t: i for i, t in enumerate(SCALE_INITS)}}
    return df.sort_values(["init", "design", "d_head"],
                          key=lambda s: s.map(order[s.name]) if s.name in order else s
                          ).reset_index(drop=True)


def placement_grid(data: StudyData) -> pd.DataFrame:
    """``scale_tune``'s grid with ``scale_tune_edge``'s points past its edges: placement,
    d_head, init, lr, mean val loss over the tuning seeds (infinite if one diverged), seeds, whether
    scale_train uses that rate, and ``edge``: chosen at an end of the (extended) grid, so the
    best rate may lie beyond it."""
    cols = ["design", "d_head", "init", "lr", "val_loss", "seeds", "chosen", "edge"]
    runs = data.runs
    g = runs[runs.experiment.isin(["scale_tune", "scale_tune_edge"])] if not runs.empty \
        else runs
    g = g.drop_duplicates("run_id") if "run_id" in g else g
    if g.empty:
        return pd.DataFrame(columns=cols)
    loss = g.val_loss if "val_loss" in g else pd.Series(float("nan"), index=g.index)
    loss = loss.where(loss.notna(), None)
    _, chosen = placement_choices(data.profile, zip(g.task, g.design, g.arm, g.lr, g.status,
                                                    loss, g.d_head, g.init))
    out = []
    for (design, d_head, init, lr), sub in g.assign(val_loss=loss).groupby(
            ["design", "d_head", "init", "lr"]):
        ok = (sub.status == "done") & sub.val_loss.notna()
        grid = sorted(g[(g.design == design) & (g.d_head == d_head) & (g.init == init)].lr
                      .unique())
        pick = chosen.get(("lm", design, "equal", int(d_head), init))
        out.append({"design": design, "d_head": int(d_head), "init": init, "lr": lr,
                    "val_loss": sub.val_loss.mean() if ok.all() else float("inf"),
                    "seeds": len(sub), "chosen": pick == lr,
                    "edge": pick == lr and lr in (grid[0], grid[-1])})
    return pd.DataFrame(out, columns=cols)


def trained_rates(data: StudyData) -> pd.DataFrame:
    """The rate each placement (inside as ``standard``, and the control) trained at per d_head
    and init in scale_train, and whether ``scale_tune`` chose it at its grid's edge."""
    cols = ["design", "d_head", "init", "lr", "edge"]
    runs = data.runs
    g = runs[runs.experiment == "scale_train"] if not runs.empty else runs
    if g.empty or "spec.train.lr" not in g:
        return pd.DataFrame(columns=cols)
    rates = g.groupby(["design", "d_head", "init"])["spec.train.lr"].first().reset_index(
    ).rename(columns={"spec.train.lr": "lr"})
    grid = placement_grid(data)
    edge = {(r.design, int(r.d_head), r.init) for r in grid[grid.chosen & grid.edge]
            .itertuples()}
    return pd.DataFrame([{"design": r.design, "d_head": int(r.d_head), "init": r.init,
                          "lr": r.lr, "edge": (r.design, int(r.d_head), r.init) in edge}
                         for r in rates.itertuples()], columns=cols)


@dataclass(frozen=True)
class ScaleAnswer:
    """What the trained placements say from one init (``init``, of ``SCALE_INITS``):
    ``effects[placement]`` = ((d_head, corrected Effect), ...) by width; ``tuned``: each
    (placement, d_head, init) at its own rate (else all at lm's); ``edges``: (placement,
    d_head) whose rate sits at the grid's edge (the control's at any init); ``means``:
    (design, d_head) -> mean test loss over seeds (inside as ``standard``, the control too)
    and ``d_model`` the residual stream's width; the probe's mechanism at its widest d_k
    (``probe_dk``): the share of saturated rows at init with 1/√d_k inside and without it
    (means over probe seeds; None without probe runs)."""

    effects: dict[str, tuple[tuple[int, Effect], ...]]
    tuned: bool
    edges: tuple[tuple[str, int], ...]
    probe_dk: int | None = None
    saturated_inside: float | None = None
    saturated_none: float | None = None
    means: dict[tuple[str, int], float] = field(default_factory=dict)
    d_model: int = 0
    init: str = SCALE_INITS[0]

    def widest(self, placement: str) -> tuple[int, Effect] | None:
        """A placement's effect at its widest d_head where standard uses attention (beats the
        control: a wider one has no verdict to read), else at its widest (None if not run)."""
        found = self.effects.get(placement, ())
        used = [f for f in found if f[1].status is not Status.ATTENTION_UNUSED]
        return (used or found or [None])[-1]

    def status(self, placement: str) -> Status | None:
        w = self.widest(placement)
        return None if w is None else w[1].status

    def unused_widths(self) -> list[int]:
        """The d_heads where standard does not beat the control: no placement is judged."""
        ds = {d for found in self.effects.values() for d, _ in found}
        return sorted(d for d in ds if all(e.status is Status.ATTENTION_UNUSED
                                           for found in self.effects.values()
                                           for w, e in found if w == d))


def scale_answer(data: StudyData, init: str = SCALE_INITS[0]) -> ScaleAnswer:
    """The ``ScaleAnswer`` of the stored runs from ``init``."""
    by: dict[str, list[tuple[int, Effect]]] = {}
    for r in placement_rows(data):
        if r["init"] == init:
            by.setdefault(r["design"], []).append(
                (int(r["d_head"]), effect(r, chance=row_chance(r, data.profile))))
    effects = {t: tuple(sorted(by[t], key=lambda x: x[0])) for t in PLACED if t in by}
    rates = trained_rates(data)
    edges = tuple((r.design, r.d_head) for r in rates[rates.edge].itertuples()
                  if r.init == init or r.design == CONTROL)
    sat = probe_at(data.probe.to_dict("records"), "saturated", 0) if not data.probe.empty else {}
    dk = max((k[1] for k in sat), default=None)

    def share(scale: str) -> float | None:
        m = mean_ci(sat.get((scale, dk), []))["mean"] if dk is not None else None
        return m if finite(m) else None
    rows = data.compared("scale_train", metric=reported())
    means = {} if rows.empty else {(r.design, int(r.d_head)): float(r.mean)
                                   for r in rows.itertuples() if finite(r.mean)
                                   and (r.init == init or r.design == CONTROL)}
    return ScaleAnswer(effects, bool(data.profile.lr_grid), edges, dk, share("inside"),
                       share("none"), means, data.profile.d_model, init)


def scale_answers(data: StudyData) -> list[ScaleAnswer]:
    """``scale_answer`` from each init of ``SCALE_INITS`` that has placement rows, in order."""
    have = {r["init"] for r in placement_rows(data)}
    return [scale_answer(data, i) for i in SCALE_INITS if i in have]
