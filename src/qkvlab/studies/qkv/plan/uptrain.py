"""The controlled conversion, written down before its runs: the study's own trained standard lm
converted to tied K = V and uptrained, where its pretraining compute is known exactly (issue 38,
item 4). Pretrained decoders (``hf.convert``) answer the same question at the scale people
use, but their pretraining is not ours to repeat; here it is.

The runs, per reported seed (``seeds``), on lm at equal width:

- the parent: standard trained its P steps (lm's steps; the same spec, hence the same run, as
  lm_tied_kv's standard);
- per start s of ``UPTRAIN_STARTS`` and fraction f of ``uptrain_fractions``: the parent tied
  K = V from s (``models.tie``) and trained u = round(f·P) more steps (``RunSpec.from_run``);
- the untied parent trained the same u steps the same way (tie "none"): the text's and the
  extra steps' own effect;
- K = V trained from scratch for P + u steps at its own tuned rate: what training with the tie
  from the start gives for the same total steps; and standard trained from scratch the same
  way, the reference that says what continuing a trained model (rather than training it with
  a schedule for P + u steps) costs by itself.

An uptraining run is a fresh AdamW and schedule (warmup ``UPTRAIN_WARMUP`` of its steps, at
least one, then the cosine to ``min_lr_ratio``), drawing the batches of its seed from step 0,
the same for every start and for the untied one. Its peak rate is ``mult`` × the parent's:
where the profile tunes rates (``lr_grid``), ``mult`` is chosen per (start, fraction) from
``uptrain_lr_grid`` by the lowest validation loss on the tuning seeds (``lr_seeds``; their
parents are lr_tune's standard runs at standard's chosen rate, scored on val only), the grid
followed outward in steps of ×3 where that choice sits on its edge (``uptrain_tune_edge``,
``edges.follow_edge``: up to ``EDGE_STEPS`` points; a choice on the last is flagged in the
report); else it is ``UPTRAIN_LR_MULT``.

The comparisons (``compute.uptrain``), on the test split, per fraction: each start against the
untied model (what the tie still costs after uptraining) and against K = V from scratch (is
converting as good as training with the tie?), in % perplexity per token with lm's margin; the
two families of |starts| × |fractions| comparisons each Holm-corrected, and read only where
standard beats lm's attention-free control (lm_tied_kv's).
"""

from __future__ import annotations

import dataclasses
import math

from qkvlab.experiments.ids import run_id
from qkvlab.experiments.registry import ResultsPending, Run, base_model, make_run
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.edges import EDGE_STEPS, follow_edge, seed_mean
from qkvlab.studies.qkv.plan.rates import design_lrs
from qkvlab.studies.qkv.plan.vocab import DESIGNS
from qkvlab.train import FromRun

UPTRAIN_STARTS = ("fitted", "avg", "keep_k")  # ours, and Kayyam et al.'s best and worst
UNTIED = "untied"  # the untied parent trained on (tie none)
KV_SCRATCH = "kv_scratch"  # K = V trained from scratch for the same total steps
STANDARD_SCRATCH = "standard_scratch"  # standard trained from scratch for the same total steps
UPTRAIN_WARMUP = 0.05  # of an uptraining run's steps
# Without a rate grid: 0.3 of the pretraining peak, between where the parent's cosine ended
# (min_lr_ratio, 0.1) and its peak, which on a trained model undoes part of what it learned.
UPTRAIN_LR_MULT = 0.3
TASK = "lm"


class ParentsPending(ResultsPending):
    """A conversion starts from its parent's trained model, and the parent has not finished."""


def steps_of(p: QKVProfile) -> int:
    """P: the parent's (lm's) training steps at the profile."""
    return int(p.task_train.get(TASK, {}).get("steps", p.steps))


def uptrain_steps(p: QKVProfile, fraction: float) -> int:
    return max(1, round(fraction * steps_of(p)))


def parent(p: QKVProfile, seed: int, tuning: bool = False) -> Run:
    """Standard lm at equal width and its rate: lm_tied_kv's run of the seed, or (``tuning``)
    lr_tune's run at standard's chosen rate, scored on val only."""
    lr = design_lrs(p, TASK, (), ("equal",)).get(("standard", "equal"))
    train = {**({"lr": lr} if lr is not None else {}), **({"test_batches": 0} if tuning else {})}
    tags = {"design": "standard", "arm": "equal"}
    if tuning:
        tags["lr"] = lr
    return make_run(TASK, base_model(p), p, seed, tags, train=train or None)


def child(p: QKVProfile, par: Run, start: str | None, fraction: float, mult: float,
          tuning: bool = False) -> Run:
    """The parent ``par`` tied K = V from ``start`` (None: kept untied) and trained on."""
    spec, ptags = par
    u = uptrain_steps(p, fraction)
    lr = float(f"{spec.train.lr * mult:.3g}")
    model = {**spec.model, **(DESIGNS["tied_kv"].model_options(p) if start else {})}
    train = {"lr": lr, "warmup": max(1, math.ceil(UPTRAIN_WARMUP * u)), "eval_every": 0,
             "checkpoint_every": max(2, u // 4), "log_every": max(1, u // 25),
             **({"test_batches": 0} if tuning else {})}
    run, _ = make_run(TASK, model, p, ptags["seed"], {}, steps=u, train=train)
    run = run.replace(from_run=FromRun(spec=spec.to_dict(), tie="kv" if start else "none",
                                       start=start))
    tags = {"design": start or UNTIED, "arm": "equal", "fraction": fraction,
            "uptrain_steps": u, "mult": mult}
    return run, {"task": TASK, "seed": ptags["seed"], **tags}


def scratch(p: QKVProfile, seed: int, fraction: float, tied: bool) -> Run:
    """K = V (``tied``) or standard trained from scratch for P + u steps at its own (tuned)
    rate."""
    design = "tied_kv" if tied else "standard"
    lr = design_lrs(p, TASK, ("tied_kv",), ("equal",)).get((design, "equal"))
    n = steps_of(p) + uptrain_steps(p, fraction)
    model = {**base_model(p), **(DESIGNS["tied_kv"].model_options(p) if tied else {})}
    tags = {"design": KV_SCRATCH if tied else STANDARD_SCRATCH, "arm": "equal",
            "fraction": fraction}
    return make_run(TASK, model, p, seed, tags, steps=n,
                    train={"lr": lr} if lr is not None else None)


def _need_done(p: QKVProfile, runs: list[Run], what: str) -> None:
    stored = p.rates.stored
    missing = [r for r in runs if stored is None or stored.get(run_id(r[0]), ("",))[0] != "done"]
    if missing:
        raise ParentsPending(
            f"profile {p.name}: {len(missing)} of the {len(runs)} {what} have not finished "
            f"(the conversion starts from their trained models); run "
            f"`qkvlab sweep lr_tune lr_tune_edge lm_tied_kv --profile {p.name}` first (qkvlab "
            f"study does)")


def tuning_runs(p: QKVProfile, mults: tuple[float, ...] | None = None) -> list[Run]:
    """``uptrain_tune``'s runs: each start and the untied model at each fraction and grid
    multiplier (``mults``: the grid), from the tuning seeds' parents (none without a rate
    grid)."""
    if not (p.uptrain_fractions and p.lr_grid and p.uptrain_lr_grid):
        return []
    parents = [parent(p, s, tuning=True) for s in p.lr_seeds]
    _need_done(p, parents, "tuning seeds' standard lm runs (lr_tune's)")
    return [child(p, par, start, f, mult, tuning=True) for par in parents
            for f in p.uptrain_fractions for start in (*UPTRAIN_STARTS, None)
            for mult in (mults or p.uptrain_lr_grid)]


def _choose(p: QKVProfile, runs: list[Run], what: str) -> dict[tuple, float]:
    """``{(start or UNTIED, fraction): mult}`` of lowest mean val loss over ``runs`` (a diverged
    or unscored run counts as infinite; ties go to the smaller rate).

    Raises:
        ParentsPending: a run of ``runs`` has not finished.
    """
    stored = p.rates.stored or {}
    losses: dict[tuple, dict[float, list[float]]] = {}
    for spec, tags in runs:
        status, val = stored.get(run_id(spec), (None, None))
        if status not in ("done", "diverged", "failed"):
            raise ParentsPending(f"profile {p.name}: {what} has not finished (its run "
                                 f"{run_id(spec)} is {status or 'not stored'}); run `qkvlab "
                                 f"sweep {what} --profile {p.name}` first")
        ok = status == "done" and val is not None and math.isfinite(val)
        losses.setdefault((tags["design"], tags["fraction"]), {}).setdefault(
            tags["mult"], []).append(val if ok else math.inf)
    return {k: min(sorted(v), key=lambda m: sum(v[m]) / len(v[m])) for k, v in losses.items()}


def _past(p: QKVProfile, mult: float, k: int) -> float | None:
    """The multiplier ``k`` steps (×3 each) past ``mult``'s end of the grid; None inside it."""
    lo, hi = min(p.uptrain_lr_grid), max(p.uptrain_lr_grid)
    if mult == lo:
        return float(f"{lo / 3 ** k:.3g}")
    return float(f"{hi * 3 ** k:.3g}") if mult == hi else None


def _followed(p: QKVProfile) -> tuple[dict[tuple, list[float]], dict[tuple, float | None]]:
    """Per (start or UNTIED, fraction), the multipliers past the grid's edge to train and the
    choice over the grid and them (``edges.follow_edge``; None while one has not finished).

    Raises:
        ParentsPending: the grid's runs have not all finished.
    """
    grid = tuning_runs(p)
    base = _choose(p, grid, "uptrain_tune")
    chain = tuple(sorted({m for b in base.values() for k in range(1, EDGE_STEPS + 1)
                          if (m := _past(p, b, k)) is not None}))
    stored = p.rates.stored or {}
    losses: dict[tuple, dict[float, list[float | None]]] = {}
    for spec, tags in grid + (tuning_runs(p, chain) if chain else []):
        status, val = stored.get(run_id(spec), (None, None))
        ok = status == "done" and val is not None and math.isfinite(val)
        v = None if status not in ("done", "diverged", "failed") else val if ok else math.inf
        losses.setdefault((tags["design"], tags["fraction"]), {}).setdefault(
            tags["mult"], []).append(v)
    points, final = {}, {}
    for key, b in base.items():
        by = losses.get(key, {})
        points[key], final[key] = follow_edge(b, lambda k, b=b: _past(p, b, k),
                                              lambda m, by=by: seed_mean(by.get(m)))
    return points, final


def edge_runs(p: QKVProfile) -> list[Run]:
    """``uptrain_tune_edge``'s runs: where a (start, fraction)'s choice on the grid sits on
    its edge, the same runs at the multipliers ``edges.follow_edge`` has reached past it
    (×3 a step); a choice on the last of them is flagged in the report (``on_edge``)."""
    if not tuning_runs(p):
        return []
    points, _ = _followed(p)
    want = sorted({m for pts in points.values() for m in pts})
    return [r for r in (tuning_runs(p, tuple(want)) if want else [])
            if r[1]["mult"] in points[(r[1]["design"], r[1]["fraction"])]]


def on_edge(p: QKVProfile, mult: float) -> bool:
    """A chosen multiplier on the last point ``edges.follow_edge`` tries past the grid: the
    best rate may lie further out."""
    if not p.uptrain_lr_grid:
        return False
    lo, hi = min(p.uptrain_lr_grid), max(p.uptrain_lr_grid)
    return mult in (_past(p, lo, EDGE_STEPS), _past(p, hi, EDGE_STEPS))


def chosen_mults(p: QKVProfile) -> dict[tuple[str, float], float]:
    """``{(start or UNTIED, fraction): mult}``: the point of lowest mean val loss over the
    tuning seeds on the grid and the points past its edge (``_followed``);
    ``UPTRAIN_LR_MULT`` everywhere without a grid.

    Raises:
        ParentsPending: the tuning runs have not all finished.
    """
    keys = [(s or UNTIED, f) for f in p.uptrain_fractions for s in (*UPTRAIN_STARTS, None)]
    if not tuning_runs(p):
        return {k: UPTRAIN_LR_MULT for k in keys}
    _, final = _followed(p)
    pending = sorted(str(k) for k, m in final.items() if m is None)
    if pending:
        raise ParentsPending(f"profile {p.name}: uptrain_tune_edge has not finished for "
                             f"{', '.join(pending)}; run `qkvlab sweep uptrain_tune_edge "
                             f"--profile {p.name}` first")
    return final


def reported_runs(p: QKVProfile) -> list[Run]:
    """``lm_convert``'s runs: the parents, their conversions and untied continuations at the
    chosen rates, and K = V from scratch at each total (none without fractions)."""
    if not p.uptrain_fractions:
        return []
    parents = [parent(p, s) for s in p.seeds]
    _need_done(p, parents, "standard lm runs (lm_tied_kv's)")
    mults = chosen_mults(p)
    runs = [(spec, {**tags, "fraction": 0.0}) for spec, tags in parents]
    for par in parents:
        for f in p.uptrain_fractions:
            runs += [child(p, par, s, f, mults[(s or UNTIED, f)])
                     for s in (*UPTRAIN_STARTS, None)]
            runs += [scratch(p, par[1]["seed"], f, tied) for tied in (True, False)]
    return runs


def with_stored(p: QKVProfile, store) -> QKVProfile:
    """``p`` with every stored run's (status, final val loss) in ``rates.stored``, where it
    converts its own lm (``uptrain_fractions``) or tunes the head-width cells' rates
    (``head_width_cells`` with a grid)."""
    wanted = p.uptrain_fractions or (p.head_width_cells and p.lr_grid)
    if not wanted or p.rates.stored is not None or store is None:
        return p
    stored = {r["id"]: (r["status"], (r["final"] or {}).get("val_loss"))
              for r in store.runs()}
    return dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored=stored))

