"""The learning-rate policy: which designs are tuned, the grid, the runs that tune them and the
rule that picks each (task, design, arm)'s rate from their validation losses.

With an empty ``lr_grid`` a profile trains every design at its task's rate. Otherwise
experiment ``lr_tune`` trains each design of ``questions.tuned_designs()`` (those the
questions compare on a tuned task) in each arm its comparisons run at
``lr_grid`` × the task's rate on ``lr_seeds`` (disjoint from the reported seeds), and the
comparisons train each (design, arm) at the rate with the lowest mean validation loss there.
Where that choice sits on the grid's edge, experiment ``lr_tune_edge`` follows it outward
(``follow_edge``): it trains the rate a grid step beyond, and the next one while the newest
point wins, at most ``EDGE_STEPS`` points; the choice is made again over the grid and those
points, and one still on the last of them is flagged in the report. The sweep lists an edge
experiment again after each of its stages (``runner.sweep``), so each step is trained once the
one before it has finished.
The rates are chosen on the ``val`` split; the tuning runs are not scored on ``test`` at all,
and the comparisons report their ``test`` numbers (``vocab.reported``).
Experiment ``scale_tune`` does the same for each placement of 1/√d_k at each head width and
init (``placement_tuning_runs``), keyed (task, placement, arm, d_head, init): a placement's
best rate may move with d_head and with the init, which are the axes of that comparison.
Where that choice sits on the grid's edge, experiment ``scale_tune_edge`` follows it the same
way (``placement_edge_runs``, ``placement_choices``).
The other tuning families (``uptrain``, ``headwidth``, ``scaling``) follow their edges with
``follow_edge`` too.
"""

from __future__ import annotations

import math

from qkvlab.experiments.registry import (
    Profile,
    ResultsPending,
    Run,
    base_model,
    make_run,
    matched,
    member_keys,
    task_info,
)
from qkvlab.experiments.store import canonical
from qkvlab.studies.qkv.plan.edges import EDGE_STEPS, argmin, follow_edge
from qkvlab.studies.qkv.plan.placements import (
    PLACEMENTS,
    SCALE_INITS,
    control_run,
    placement_run,
)
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.questions import equal_only, tuned_designs
from qkvlab.studies.qkv.plan.vocab import CONTROL, DESIGNS


class RatesPending(ResultsPending):
    """A comparison's runs depend on the rates ``lr_tune`` chooses, and it has not finished."""


def task_lr(task: str, p: Profile) -> float:
    """The learning rate a task trains at without tuning (its override, else the profile's)."""
    return float(p.task_train.get(task, {}).get("lr", p.lr))


def lr_of(task: str, mult: float, p: Profile) -> float:
    """A grid point: ``mult`` × the task's rate, to 3 significant digits (so the same rate is
    the same run id whichever multiplier reaches it)."""
    return float(f"{task_lr(task, p) * mult:.3g}")


def tuned_arms(p: QKVProfile, task: str, label: str) -> tuple[str, ...]:
    """The arms whose rate ``lr_tune`` tunes for a design: those its comparisons run."""
    if label == "standard" or label in equal_only():
        return ("equal",)
    return tuple(p.task_arms.get(task, ("equal", "matched")))


def design_lrs(p: QKVProfile, task: str, designs, arms=("equal", "matched")
               ) -> dict[tuple[str, str], float]:
    """``{(label, arm): learning rate}`` of ``standard`` and ``designs`` in ``arms`` on
    ``task`` (empty when every design trains at the task's rate).

    Raises:
        RatesPending: the profile tunes rates and ``lr_tune`` has not chosen them yet.
    """
    if not p.lr_grid or task not in tuned_designs():
        return {}
    lrs = p.rates.lrs or {}

    def key(d: str, arm: str) -> tuple[str, str, str]:
        return (task, d, "equal" if d == "standard" else arm)
    want = [(d, arm) for arm in arms for d in ("standard", *designs)]
    missing = sorted({f"{d} ({key(d, a)[2]})" for d, a in want if key(d, a) not in lrs})
    if missing:
        raise RatesPending(
            f"profile {p.name}: {task} trains each design at the learning rate that "
            f"experiments lr_tune and lr_tune_edge chose, and they have not finished for "
            f"{missing}; run `qkvlab sweep lr_tune --profile {p.name}`, then lr_tune_edge, "
            f"first (qkvlab study does)")
    return {(d, a): lrs[key(d, a)] for d, a in want}


def tuning_run(p: QKVProfile, task: str, d: str, arm: str, lr: float, seed: int) -> Run:
    """One tuning run: design ``d`` in ``arm`` on ``task`` at rate ``lr``, scored on val only (a
    tuning run never sees the test split)."""
    base = base_model(p)
    m = {**base, **DESIGNS[d].model_options(p)}
    if arm == "matched":
        m = matched(m, base, task_info(task)[1])
    return make_run(task, m, p, seed, {"design": d, "arm": arm, "lr": lr},
                    train={"lr": lr, "test_batches": 0})


def tuned_keys(p: QKVProfile) -> list[tuple[str, str, str]]:
    """(task, design, arm) of every rate ``lr_tune`` chooses: none on a task the profile
    gives no seeds (``task_seeds``), whose comparisons list no runs, and at a profile that
    lists its ``experiments`` only the designs those compare (with standard and the
    control)."""
    return [(task, d, arm) for task, labels in tuned_designs(p.experiments).items()
            if p.task_seeds.get(task, p.seeds)
            for arm in ("equal", "matched") for d in ("standard", *labels)
            if arm in tuned_arms(p, task, d)]


def tuning_runs(p: QKVProfile) -> list[Run]:
    """``lr_tune``'s runs: every tuned design, in each arm it is compared in, at every grid
    point, on the tuning seeds."""
    keys = tuned_keys(p)
    return [tuning_run(p, task, d, arm, lr_of(task, mult, p), seed)
            for task in tuned_designs() for mult in p.lr_grid for seed in p.lr_seeds
            for arm in ("equal", "matched") for t, d, a in keys if (t, a) == (task, arm)]


def lr_edge_runs(p: QKVProfile) -> list[Run]:
    """``lr_tune_edge``'s runs: for each (task, design, arm) whose ``lr_tune`` choice sits on
    the grid's edge, the points ``follow_edge`` has reached past it (``p.rates.lr_edge_points``),
    on the tuning seeds, scored on val only like the grid's.

    Raises:
        RatesPending: ``lr_tune`` has not chosen every rate yet.
    """
    if not p.lr_grid:
        return []
    points = p.rates.lr_edge_points or {}
    keys = tuned_keys(p)
    missing = sorted(f"{t} {d} ({a})" for t, d, a in keys if (t, d, a) not in points)
    if missing:
        raise RatesPending(
            f"profile {p.name}: lr_tune_edge extends lr_tune's grid where its choice sits on an "
            f"edge, and lr_tune has not chosen {', '.join(missing)}; run `qkvlab sweep lr_tune "
            f"--profile {p.name}` first (qkvlab study does)")
    return [tuning_run(p, t, d, a, lr, seed) for t, d, a in keys
            for lr in points[(t, d, a)] for seed in p.lr_seeds]


def lr_edge_candidates(p: QKVProfile, base: dict[tuple, float]) -> list[Run]:
    """Every run ``lr_tune_edge`` may list from the grid's choices ``base``: each point up to
    ``EDGE_STEPS`` past an edge choice, on the tuning seeds (which of them count is
    ``follow_edge``'s)."""
    keys = set(tuned_keys(p))
    return [tuning_run(p, t, d, a, lr, seed) for (t, d, a), b in base.items()
            if (t, d, a) in keys for k in range(1, EDGE_STEPS + 1)
            if (lr := grid_edge(p, t, b, k)) is not None for seed in p.lr_seeds]


def placement_keys(p: QKVProfile) -> list[tuple[str, int, str]]:
    """``(placement, d_head, init)`` of every rate ``scale_tune`` chooses: each placement from
    each init of ``SCALE_INITS``, and the control (which has no Q or K to initialize) from the
    model's own, at every head width of ``scale_train_d_heads``."""
    return [(tag, d, i) for d in p.scale_train_d_heads
            for tag, i in ((t, i) for i in SCALE_INITS for t in PLACEMENTS)] + [
        (CONTROL, d, SCALE_INITS[0]) for d in p.scale_train_d_heads]


def _placement(p: QKVProfile, key: tuple[str, int, str], seed: int, lr: float) -> Run:
    tag, d_head, init = key
    none = {"test_batches": 0}  # like lr_tune's: val only
    if tag == CONTROL:
        return control_run(p, d_head, seed, {"lr": lr}, lr=lr, train=none)
    return placement_run(p, tag, d_head, seed, {"lr": lr}, lr=lr, train=none, init=init)


def placement_tuning_runs(p: QKVProfile) -> list[Run]:
    """``scale_tune``'s runs: every key of ``placement_keys`` at every grid point, on the
    tuning seeds (none without a grid). The control is tuned per d_head too: its best rate
    can move with the width, and at another width's rate it would be a weaker baseline, so
    standard would "use attention" by the rate alone. Like lr_tune's, they score no test
    batches."""
    return [_placement(p, key, seed, lr) for mult in p.lr_grid
            for lr in (lr_of("lm", mult, p),) for seed in p.lr_seeds
            for key in placement_keys(p)]


def grid_edge(p: Profile, task: str, lr: float, k: int = 1) -> float | None:
    """The rate ``k`` grid steps past ``lr`` (the task's grid) if ``lr`` is an end of the grid,
    else None: below the smallest, the smallest × (its ratio to the next)^k; above the
    largest, likewise."""
    mults = sorted(p.lr_grid)
    if len(mults) < 2:
        return None
    if lr == lr_of(task, mults[0], p):
        return lr_of(task, mults[0] * mults[0] ** k / mults[1] ** k, p)
    if lr == lr_of(task, mults[-1], p):
        return lr_of(task, mults[-1] * mults[-1] ** k / mults[-2] ** k, p)
    return None


def placement_edge(p: Profile, lr: float, k: int = 1) -> float | None:
    """``grid_edge`` on lm's grid (the placements of 1/√d_k train on lm)."""
    return grid_edge(p, "lm", lr, k)


def placement_edge_runs(p: QKVProfile) -> list[Run]:
    """``scale_tune_edge``'s runs: for each key of ``placement_keys`` whose ``scale_tune``
    choice sits on the grid's edge, the points ``follow_edge`` has reached past it
    (``p.rates.scale_edge_points``), on the tuning seeds, scored on val only like the grid's.

    Raises:
        RatesPending: ``scale_tune`` has not chosen every key yet.
    """
    if not p.lr_grid:
        return []
    points = p.rates.scale_edge_points or {}
    keys = placement_keys(p)
    missing = [f"{tag} at d_head {d} from the {i} init" for tag, d, i in keys
               if ("lm", tag, "equal", d, i) not in points]
    if missing:
        raise RatesPending(
            f"profile {p.name}: scale_tune_edge extends scale_tune's grid where its choice sits "
            f"on an edge, and scale_tune has not chosen {', '.join(missing)}; run `qkvlab "
            f"sweep scale_tune --profile {p.name}` first (qkvlab study does)")
    return [_placement(p, key, seed, lr) for key in keys
            for lr in points[("lm", key[0], "equal", key[1], key[2])] for seed in p.lr_seeds]


def placement_edge_candidates(p: QKVProfile, base: dict[tuple, float]) -> list[Run]:
    """Every run ``scale_tune_edge`` may list from the grid's choices ``base`` (as
    ``lr_edge_candidates``)."""
    return [_placement(p, key, seed, lr) for key in placement_keys(p)
            if (b := base.get(("lm", key[0], "equal", key[1], key[2]))) is not None
            for k in range(1, EDGE_STEPS + 1)
            if (lr := placement_edge(p, b, k)) is not None for seed in p.lr_seeds]


def _scores(rows) -> dict[tuple, dict[float, list[float]]]:
    """Val losses per key and rate from ``choose_lrs``' rows of finished runs (infinite: a
    diverged run, or one without a loss)."""
    scores: dict[tuple, dict[float, list[float]]] = {}
    for task, design, arm, lr, status, loss, *width in rows:
        if status not in ("done", "diverged"):
            continue
        ok = status == "done" and loss is not None and math.isfinite(loss)
        key = (task, design, arm) + tuple(w if isinstance(w, str) else int(w)
                                          for w in width if w is not None)
        scores.setdefault(key, {}).setdefault(float(lr), []).append(loss if ok else math.inf)
    return scores


def choose_lrs(p: QKVProfile, rows, lost: float | None = None) -> dict[tuple, float]:
    """The rate with the lowest mean val loss over ``lr_seeds`` per (task, design, arm), from
    rows ``(task, design, arm, lr, status, val_loss)``, or per (task, design, arm, d_head,
    init) from rows with more items (``d_head``, ``init``; None: no such key); only designs
    whose whole grid (the task's) has finished, and no other rate listed. A diverged run (or
    one without a loss) counts as infinite loss; ties go to the smaller rate. A design whose
    whole grid finished without a finite loss has no rate, or ``lost`` where that is given."""
    out = {}
    for key, by_lr in _scores(rows).items():
        grid = {lr_of(key[0], m, p) for m in p.lr_grid}
        if set(by_lr) == grid and all(len(v) == len(p.lr_seeds) for v in by_lr.values()):
            means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
            best = argmin(means, means.__getitem__)
            if math.isfinite(means[best]):
                out[key] = best
            elif lost is not None:  # the whole grid finished and diverged: say so
                out[key] = lost
    return out


def edge_choices(p: QKVProfile, rows, lost: float | None = None
                 ) -> tuple[dict[tuple, float], dict[tuple, float], dict[tuple, tuple]]:
    """The choices on each task's grid, the final ones, and the points past each grid's edge
    to train, from rows of ``choose_lrs`` (a tuning experiment's grid runs and its edge
    experiment's), keyed as ``choose_lrs`` keys them. Final: the grid's choice, or where it
    sits on an edge ``follow_edge``'s over the grid's choice and the points past it (absent
    until they have finished). Points: ``follow_edge``'s, () for a choice inside the grid or
    a key whose whole grid diverged (``lost``)."""
    rows = list(rows)
    grid = {t: {lr_of(t, m, p) for m in p.lr_grid} for t in {r[0] for r in rows}}
    base = choose_lrs(p, [r for r in rows if float(r[3]) in grid[r[0]]], lost=lost)
    means = {k: {lr: sum(v) / len(v) for lr, v in by.items() if len(v) == len(p.lr_seeds)}
             for k, by in _scores(rows).items()}
    final, points = {}, {}
    for k, lr in base.items():
        if lr is None or not math.isfinite(lr):  # the whole grid diverged: nothing to follow
            points[k] = ()
            continue
        pts, choice = follow_edge(lr, lambda n, k=k, lr=lr: grid_edge(p, k[0], lr, n),
                                  means.get(k, {}).get)
        points[k] = tuple(pts)
        if choice is not None:
            final[k] = choice
    return base, final, points


def grid_choices(p: QKVProfile, rows, lost: float | None = None
                 ) -> tuple[dict[tuple, float], dict[tuple, float]]:
    """``edge_choices``' choices on the grid and final ones."""
    base, final, _ = edge_choices(p, rows, lost)
    return base, final


def placement_choices(p: QKVProfile, rows) -> tuple[dict[tuple, float], dict[tuple, float]]:
    """``scale_tune``'s choices (``grid_choices``), rows with ``d_head`` and ``init``, keyed
    (task, placement, arm, d_head, init)."""
    return grid_choices(p, rows)


def _rows(store, name: str, p: QKVProfile, runs: list[Run], width: bool):
    """``choose_lrs``' rows of the runs ``runs`` lists that ``store`` holds; ``width``: with
    the placements' keys (d_head, init)."""
    listed = member_keys(runs)
    return [(r["tags"]["task"], r["tags"]["design"], r["tags"]["arm"], r["tags"]["lr"],
             r["status"], r["final"].get("val_loss"),
             *((r["tags"].get("d_head"), r["tags"].get("init")) if width else ()))
            for r in store.runs(name, p.name) if (r["id"], canonical(r["tags"])) in listed]


def _followed(p: QKVProfile, store, placements: bool):
    """``edge_choices`` over a tuning experiment's grid runs and its edge experiment's in
    ``store`` (``lr_tune``/``lr_tune_edge``, or with ``placements`` ``scale_tune``/
    ``scale_tune_edge``); a key whose whole grid diverged has no final choice and no points.
    Only the runs the profile lists now count: a store keeps those of earlier grids."""
    if placements:
        tune, edge, grid, cands = ("scale_tune", "scale_tune_edge", placement_tuning_runs(p),
                                   placement_edge_candidates)
    else:
        tune, edge, grid, cands = "lr_tune", "lr_tune_edge", tuning_runs(p), lr_edge_candidates
    rows = _rows(store, tune, p, grid, placements)
    base, _, _ = edge_choices(p, rows, math.nan)
    return edge_choices(p, rows + _rows(store, edge, p, cands(p, base), placements), math.nan)


def lr_edge_plan(p: QKVProfile, store) -> dict[tuple, tuple]:
    """The plan of ``lr_tune_edge`` (``lr_edge_runs`` reads it as ``p.rates.lr_edge_points``):
    per (task, design, arm) whose grid finished, the points past its edge to train."""
    return _followed(p, store, False)[2]


def placement_edge_plan(p: QKVProfile, store) -> dict[tuple, tuple]:
    """The plan of ``scale_tune_edge`` (``placement_edge_runs`` reads it as
    ``p.rates.scale_edge_points``)."""
    return _followed(p, store, True)[2]


def chosen_lrs(p: QKVProfile, store) -> dict[tuple, float]:
    """``{(task, design, arm): rate}``: the final choices of ``lr_tune`` and ``lr_tune_edge``,
    and ``{(task, placement, arm, d_head, init): rate}``: those of ``scale_tune`` and
    ``scale_tune_edge`` (``edge_choices``), from their finished runs in ``store``."""
    return {**_followed(p, store, False)[1], **_followed(p, store, True)[1]}
