"""The learning-rate policy: which designs are tuned, the grid, the runs that tune them and the
rule that picks each (task, design, arm)'s rate from their validation losses.

With an empty ``lr_grid`` a profile trains every design at its task's rate. Otherwise
experiment ``lr_tune`` trains each design of ``TUNED`` in each arm its comparisons run at
``lr_grid`` × the task's rate on ``lr_seeds`` (disjoint from the reported seeds), and the
comparisons train each (design, arm) at the rate with the lowest mean validation loss there.
The rates are chosen on the ``val`` split; the tuning runs are not scored on ``test`` at all,
and the comparisons report their ``test`` numbers (``vocab.reported``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

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
from qkvlab.studies.qkv.plan.vocab import DESIGNS

if TYPE_CHECKING:  # profiles imports this module
    from qkvlab.studies.qkv.plan.profiles import QKVProfile


class RatesPending(ResultsPending):
    """A comparison's runs depend on the rates ``lr_tune`` chooses, and it has not finished."""


# The designs each tuned task compares, and so the learning-rate grid.
# The control is tuned like the others: at an untuned rate it would be a weaker baseline, and
# standard would "use attention" by the rate alone.
TUNED = {"lm": ("alt", "tied_qk", "tied_qk_selfmask", "tied_qkv", "tied_kv", "gqa_half",
                "control"),
         "mlm": ("tied_qk", "tied_qk_selfmask", "tied_qkv", "control"),
         "translate": ("alt", "alt_identity", "tied_kv_cross", "control")}
# designs compared at equal width only (lm_gqa, alt_init, the control): no matched-width rate
EQUAL_ONLY = frozenset({"gqa_half", "alt_identity", "control"})


def task_lr(task: str, p: Profile) -> float:
    """The learning rate a task trains at without tuning (its override, else the profile's)."""
    return float(p.task_train.get(task, {}).get("lr", p.lr))


def lr_of(task: str, mult: float, p: Profile) -> float:
    """A grid point: ``mult`` × the task's rate, to 3 significant digits (so the same rate is
    the same run id whichever multiplier reaches it)."""
    return float(f"{task_lr(task, p) * mult:.3g}")


def tuning_runs(p: QKVProfile) -> list[Run]:
    """``lr_tune``'s runs: every tuned design, in each arm it is compared in, at every grid
    point, on the tuning seeds."""
    runs = []
    for task, labels in TUNED.items():
        base, kind = base_model(p), task_info(task)[1]
        for mult in p.lr_grid:
            lr = lr_of(task, mult, p)
            for seed in p.lr_seeds:
                for arm in ("equal", "matched"):
                    for d in ("standard", *labels):
                        if arm not in p.tuned_arms(task, d):
                            continue
                        m = {**base, **DESIGNS[d].model_options(p)}
                        if arm == "matched":
                            m = matched(m, base, kind)
                        # scored on val only: a tuning run never sees the test split
                        runs.append(make_run(task, m, p, seed,
                                             {"design": d, "arm": arm, "lr": lr},
                                             train={"lr": lr, "test_batches": 0}))
    return runs


def choose_lrs(p: QKVProfile, rows) -> dict[tuple[str, str, str], float]:
    """The rate with the lowest mean val loss over ``lr_seeds`` per (task, design, arm), from
    rows ``(task, design, arm, lr, status, val_loss)``; only designs whose whole grid has
    finished. A diverged run (or one without a loss) counts as infinite loss; ties go to the
    smaller rate."""
    scores: dict[tuple[str, str, str], dict[float, list[float]]] = {}
    for task, design, arm, lr, status, loss in rows:
        if status not in ("done", "diverged"):
            continue
        ok = status == "done" and loss is not None and math.isfinite(loss)
        scores.setdefault((task, design, arm), {}).setdefault(float(lr), []).append(
            loss if ok else math.inf)
    out = {}
    for key, by_lr in scores.items():
        grid = {lr_of(key[0], m, p) for m in p.lr_grid}
        if set(by_lr) == grid and all(len(v) == len(p.lr_seeds) for v in by_lr.values()):
            means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
            best = min(sorted(means), key=lambda lr: means[lr])
            if math.isfinite(means[best]):
                out[key] = best
    return out


def chosen_lrs(p: QKVProfile, store) -> dict[tuple[str, str, str], float]:
    """``{(task, design, arm): rate}`` chosen from ``lr_tune``'s finished runs in ``store``
    (only the runs the profile's grid lists now: a store keeps those of earlier grids)."""
    listed = member_keys(tuning_runs(p))
    return choose_lrs(p, ((r["tags"]["task"], r["tags"]["design"], r["tags"]["arm"],
                           r["tags"]["lr"], r["status"], r["final"].get("val_loss"))
                          for r in store.runs("lr_tune", p.name)
                          if (r["id"], canonical(r["tags"])) in listed))
