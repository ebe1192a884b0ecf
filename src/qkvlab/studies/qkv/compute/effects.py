"""One comparison row vs standard -> its effect in the unit people quote and its verdict.

Units: losses as % perplexity (exp(Δ val loss) − 1: val losses are mean token cross-entropies),
accuracies in percentage points, chrF in points, throughput in % (``plan.vocab.METRICS``). The
verdict applies ``qkvlab.stats.decide`` with the metric's practical margin, written down before
the runs: worse / better (the paired 95% CI excludes 0), equivalent (the 90% CI lies inside
±margin: a TOST at 5%), undecided (neither; with the number of seeds that the observed paired
spread says would decide it), not learned (neither design learned the task). Every table,
figure and sentence of the report reads effects through :func:`effect`; ``render.text`` words
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from qkvlab.stats import decide
from qkvlab.studies.qkv.plan.vocab import metric_of

LN2 = math.log(2)  # a loss task counts as learned once a design halves context-free perplexity


class Status(str, Enum):
    """The verdict on one comparison (a ``str``, so it compares equal to its value)."""

    WORSE = "worse"
    BETTER = "better"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"
    NOT_LEARNED = "not_learned"  # neither design learned the task: no verdict
    MISSING = "missing"  # nothing to compare (no runs, or a metric without a scale)


@dataclass(frozen=True)
class Effect:
    """A design's effect vs standard and its verdict.

    ``value`` ± ``half`` in the display ``unit`` (``lo``/``hi`` the 95% CI mapped there; for
    perplexity the map is not linear, so ``half`` is half of ``hi − lo``); ``seeds`` the count
    that would decide an undecided one; ``n`` the paired seeds it rests on. ``significant``: an
    equivalent effect whose 95% CI still excludes 0; ``identical``: every seed scored the same
    for both. ``mean``/``baseline_mean``/``chance``: the levels a not-learned verdict quotes.
    """

    status: Status
    what: str = ""
    unit: str = ""
    margin: str = ""
    value: float | None = None
    half: float | None = None
    lo: float | None = None
    hi: float | None = None
    seeds: int | None = None
    n: int = 0
    significant: bool = False
    identical: bool = False
    lower_is_better: bool = True
    mean: float | None = None
    baseline_mean: float | None = None
    chance: float | None = None


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def effect(c: dict | None, what: str | None = None, chance: float | None = None) -> Effect:
    """The effect and verdict of one ``stats.compare`` row vs standard, read by its metric's
    row (direction, display unit, margin).

    With ``chance`` (the task's chance level, ``results.chance``), a comparison where neither
    design got to 1.5× an accuracy task's guessing rate, or to half the perplexity of a loss
    task's context-free guess (val loss ``chance − ln 2``), is ``NOT_LEARNED``.
    """
    m = metric_of((c or {}).get("metric", ""))
    if m is None or m.show is None:
        return Effect(Status.MISSING)
    raw = c.get("diff" if m.field == "diff" else "rel_pct")
    sd = c.get("diff_sd" if m.field == "diff" else "rel_sd")
    lower = m.lower_is_better
    base = {"what": what or m.what, "unit": m.unit, "lower_is_better": lower}
    if not finite(raw):
        return Effect(Status.MISSING, unit=m.unit)
    if chance is not None and finite(c.get("mean")) and finite(c.get("baseline_mean")):
        mean, ref = c["mean"], c["baseline_mean"]
        if (not lower and max(mean, ref) < 1.5 * chance) or \
                (lower and min(mean, ref) > chance - LN2):
            return Effect(Status.NOT_LEARNED, mean=mean, baseline_mean=ref, chance=chance, **base)
    n = int(c.get("n_pairs") or 0)
    d = decide(raw, sd if finite(sd) else float("nan"), n, m.raw_margin, lower_is_better=lower)
    value = m.show(raw)
    if not finite(d["half"]):
        return Effect(Status.UNDECIDED, value=value, n=n, **base)
    lo, hi = m.show(d["lo"]), m.show(d["hi"])
    return Effect(Status(d["status"]), value=value, half=(hi - lo) / 2, lo=lo, hi=hi,
                  seeds=d["seeds"] if d["status"] == "undecided" else None, n=n,
                  margin=m.margin_text, significant=bool(d["significant"]),
                  identical=raw == 0 and sd == 0, **base)
