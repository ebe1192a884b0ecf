"""The learning-rate policy: which designs are tuned, the grid, the runs that tune them and the
rule that picks each (task, design, arm)'s rate from their validation losses.

With an empty ``lr_grid`` a profile trains every design at its task's rate. Otherwise
experiment ``lr_tune`` trains each design of ``TUNED`` in each arm its comparisons run at
``lr_grid`` × the task's rate on ``lr_seeds`` (disjoint from the reported seeds), and the
comparisons train each (design, arm) at the rate with the lowest mean validation loss there.
The rates are chosen on the ``val`` split; the tuning runs are not scored on ``test`` at all,
and the comparisons report their ``test`` numbers (``vocab.reported``).
Experiment ``scale_tune`` does the same for each placement of 1/√d_k at each head width
(``placement_tuning_runs``), keyed (task, placement, arm, d_head): a placement's best rate may
move with d_head, which is the axis of that comparison.
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
from qkvlab.studies.qkv.plan.placements import PLACEMENTS, control_run, placement_run
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
         # the character-level second row, equal width only (profiles' task_arms)
         "lm_char": ("alt", "tied_qk", "tied_qk_selfmask", "tied_qkv", "tied_kv", "control"),
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


def placement_tuning_runs(p: QKVProfile) -> list[Run]:
    """``scale_tune``'s runs: every placement of 1/√d_k (``placements.PLACEMENTS``) at every
    head width of ``scale_train_d_heads``, at every grid point, on the tuning seeds (none
    without a grid), and the attention-free control at each width: its best rate moves with
    d_head too (two heads of 256 make a 512-wide value path), and at another width's rate it
    would be a weaker baseline, so standard would "use attention" by the rate alone. Like
    lr_tune's, they score no test batches."""
    none = {"test_batches": 0}
    return [run for mult in p.lr_grid for lr in (lr_of("lm", mult, p),) for seed in p.lr_seeds
            for d_head in p.scale_train_d_heads
            for run in (*(placement_run(p, tag, d_head, seed, {"lr": lr}, lr=lr, train=none)
                          for tag in PLACEMENTS),
                        control_run(p, d_head, seed, {"lr": lr}, lr=lr, train=none))]


def choose_lrs(p: QKVProfile, rows) -> dict[tuple, float]:
    """The rate with the lowest mean val loss over ``lr_seeds`` per (task, design, arm), from
    rows ``(task, design, arm, lr, status, val_loss)``, or per (task, design, arm, d_head)
    from rows with a 7th item ``d_head`` (None: no width key); only designs whose whole grid
    has finished. A diverged run (or one without a loss) counts as infinite loss; ties go to
    the smaller rate."""
    scores: dict[tuple, dict[float, list[float]]] = {}
    for task, design, arm, lr, status, loss, *width in rows:
        if status not in ("done", "diverged"):
            continue
        ok = status == "done" and loss is not None and math.isfinite(loss)
        key = (task, design, arm) + tuple(int(w) for w in width if w is not None)
        scores.setdefault(key, {}).setdefault(float(lr), []).append(loss if ok else math.inf)
    out = {}
    for key, by_lr in scores.items():
        grid = {lr_of(key[0], m, p) for m in p.lr_grid}
        if set(by_lr) == grid and all(len(v) == len(p.lr_seeds) for v in by_lr.values()):
            means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
            best = min(sorted(means), key=lambda lr: means[lr])
            if math.isfinite(means[best]):
                out[key] = best
    return out


def chosen_lrs(p: QKVProfile, store) -> dict[tuple, float]:
    """``{(task, design, arm): rate}`` chosen from ``lr_tune``'s finished runs in ``store``,
    and ``{(task, placement, arm, d_head): rate}`` from ``scale_tune``'s (only the runs the
    profile's grid lists now: a store keeps those of earlier grids)."""
    out = {}
    for name, runs in (("lr_tune", tuning_runs(p)), ("scale_tune", placement_tuning_runs(p))):
        listed = member_keys(runs)
        out.update(choose_lrs(p, ((r["tags"]["task"], r["tags"]["design"], r["tags"]["arm"],
                                   r["tags"]["lr"], r["status"], r["final"].get("val_loss"),
                                   r["tags"].get("d_head") if name == "scale_tune" else None)
                                  for r in store.runs(name, p.name)
                                  if (r["id"], canonical(r["tags"])) in listed)))
    return out
