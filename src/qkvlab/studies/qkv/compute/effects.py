"""One comparison row vs standard -> its effect in the unit people quote and its verdict.

Units: losses as % perplexity (exp(Δ test loss) − 1: test losses are mean token cross-entropies),
accuracies in percentage points, chrF in points, throughput in % (``plan.vocab.METRICS``). The
verdict applies ``qkvlab.stats.decide`` with the metric's practical margin, written down before
the runs: worse / better (the paired 95% CI excludes 0), equivalent (the 90% CI lies inside
±margin: a TOST at 5%), undecided (neither; with the number of seeds that the observed paired
spread says would decide it), not learned (neither design learned the task). Every table,
figure and sentence of the report reads effects through :func:`effect`; ``render.text`` words
them.

A row of a question's family of headline comparisons carries Holm's adjusted p (``p_adj``,
``compute.multiplicity``): a worse, better or equivalent verdict whose adjusted p exceeds
``plan.families.ALPHA`` reads *undecided*, ``raw_status`` keeping what the test alone said
("not significant after Holm"). A row without ``p_adj`` (outside the families, or built by
hand) keeps its raw verdict, so ``effect`` still reads a single row.

Attention used: every comparison experiment also trains the attention-free control
(``vocab.CONTROL``, uniform scores) beside standard. A verdict on a learned metric is decided
only where standard beats the control by more than the metric's margin: the control's paired
95% CI vs standard lies wholly past the margin on the worse side (:func:`attention_used`,
marked on each row as ``attention_used`` by ``results.comparisons``). Otherwise the row reads
``ATTENTION_UNUSED`` ("attention not used at this budget"), whatever its test said, with that
verdict kept in ``raw_status``: at this budget standard's own scores do not yet do better than
averaging the context, so a design that changes how scores are made cannot be judged. Such a
row keeps its p and stays in its Holm family (``correct`` counts it), as a not-learned one does.
A row without a control (``attention_used`` absent or NaN) keeps its verdict.

``undecided``'s seed count is the number of seeds a new experiment would need for 80% power
to decide it (``stats.seeds_for_power``) if the true effect and spread were the observed ones:
at 5%, or for a family member at 5%/m (Holm's first and strictest level), so that those seeds
would also decide it after the correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from qkvlab.stats import decide, seeds_for_power
from qkvlab.studies.qkv.plan.families import ALPHA
from qkvlab.studies.qkv.plan.vocab import TASK_METRIC, metric_of

LN2 = math.log(2)  # a loss task counts as learned once a design halves context-free perplexity


class Status(str, Enum):
    """The verdict on one comparison (a ``str``, so it compares equal to its value)."""

    WORSE = "worse"
    BETTER = "better"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"
    NOT_LEARNED = "not_learned"  # neither design learned the task: no verdict
    ATTENTION_UNUSED = "attention_unused"  # standard does not beat the attention-free control
    MISSING = "missing"  # nothing to compare (no runs, or a metric without a scale)


@dataclass(frozen=True)
class Effect:
    """A design's effect vs standard and its verdict.

    ``value`` ± ``half`` in the display ``unit`` (``lo``/``hi`` the 95% CI mapped there; for
    perplexity the map is not linear, so ``half`` is half of ``hi − lo``); ``seeds`` the seeds
    for 80% power to decide an undecided one; ``n`` the paired seeds it rests on, ``lost`` and
    ``baseline_lost`` how many of them the design and standard lost (diverged or failed; they
    enter at the worst value, ``stats.compare``). ``significant``: an equivalent effect whose
    95% CI still excludes 0; ``identical``: every seed scored the same for both.
    ``mean``/``baseline_mean``/``chance``: the levels a not-learned verdict quotes. ``p``: the
    p of the test that decided the raw verdict; ``family``/``family_m``/``p_adj``: the
    question whose headline family holds it, its size and Holm's adjusted p; ``raw_status``:
    the verdict before correction, where the correction changed it, or before the control's
    gate for ``ATTENTION_UNUSED``; ``control_value``/``control_half``/``control_unit``/
    ``control_what``: the control vs standard that the gate read (on the task's own metric, in
    its display unit, 95% CI).
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
    lost: int = 0
    baseline_lost: int = 0
    p: float | None = None
    p_adj: float | None = None
    family: str = ""
    family_m: int = 0
    raw_status: Status | None = None
    control_value: float | None = None
    control_half: float | None = None
    control_unit: str = ""
    control_what: str = ""


def attention_used(c: dict | None) -> bool | None:
    """Whether standard beats the attention-free control by more than the metric's margin, from
    the control's comparison row (control − standard, paired by seed): its 95% CI lies wholly
    past the margin on the control's worse side. None when the row cannot say (no row, no
    difference, a metric without a margin); False with one seed (no CI: not shown used)."""
    m = metric_of((c or {}).get("metric", ""))
    raw = (c or {}).get("diff" if m is not None and m.field == "diff" else "rel_pct")
    if m is None or m.show is None or not finite(raw):
        return None
    sd = c.get("diff_sd" if m.field == "diff" else "rel_sd")
    n = int(c.get("n_pairs") or 0)
    if n < 2 or not finite(sd):
        return False
    d = decide(raw, sd, n, m.raw_margin, lower_is_better=m.lower_is_better)
    return bool(d["lo"] > m.raw_margin if m.lower_is_better else d["hi"] < -m.raw_margin)


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
    base = {"what": what or m.what, "unit": m.unit, "lower_is_better": lower,
            "lost": _count(c.get("lost")), "baseline_lost": _count(c.get("baseline_lost"))}
    if not finite(raw):
        return Effect(Status.MISSING, unit=m.unit)
    if chance is not None and finite(c.get("mean")) and finite(c.get("baseline_mean")):
        mean, ref = c["mean"], c["baseline_mean"]
        if (not lower and max(mean, ref) < 1.5 * chance) or \
                (lower and min(mean, ref) > chance - LN2):
            return Effect(Status.NOT_LEARNED, mean=mean, baseline_mean=ref, chance=chance, **base)
    n = int(c.get("n_pairs") or 0)
    sd = sd if finite(sd) else float("nan")
    d = decide(raw, sd, n, m.raw_margin, lower_is_better=lower)
    value = m.show(raw)
    used, control = _control(c, m)
    if not finite(d["half"]):
        status = Status.UNDECIDED if used is not False else Status.ATTENTION_UNUSED
        raw_status = Status.UNDECIDED if used is False else None
        return Effect(status, value=value, n=n, raw_status=raw_status, **control, **base)
    status, seeds, raw_status = Status(d["status"]), d["seeds"], None
    p_adj = c.get("p_adj") if finite(c.get("p_adj")) else None
    if p_adj is not None and p_adj > ALPHA and status is not Status.UNDECIDED:
        raw_status, status = status, Status.UNDECIDED
    fam_m = _count(c.get("family_m"))
    if status is Status.UNDECIDED and fam_m:  # power at α/m, the level Holm tests first at
        seeds = seeds_for_power(raw, sd, m.raw_margin, level=1 - ALPHA / fam_m)[0]
    lo, hi = m.show(d["lo"]), m.show(d["hi"])
    fam = c.get("family")
    if used is False:
        raw_status, status = status, Status.ATTENTION_UNUSED
    return Effect(status, value=value, half=(hi - lo) / 2, lo=lo, hi=hi,
                  seeds=seeds if status is Status.UNDECIDED else None, n=n,
                  margin=m.margin_text, significant=bool(d["significant"]),
                  identical=raw == 0 and sd == 0, p=d["p_decided"], p_adj=p_adj,
                  family=fam if isinstance(fam, str) else "",
                  family_m=fam_m, raw_status=raw_status, **control, **base)


def _control(c: dict, m) -> tuple[bool | None, dict]:
    """The row's gate (``attention_used``: None where it has none or its metric is not
    gated) and the control's effect it read, as ``Effect`` fields."""
    used = c.get("attention_used")
    if not m.gated or used is None or (isinstance(used, float) and math.isnan(used)):
        return None, {}
    own = metric_of(TASK_METRIC.get(c.get("task"), "")) or m  # the metric the gate read
    return bool(used), {"control_unit": own.unit, "control_what": own.what,
                        **{k: c[k] for k in ("control_value", "control_half") if finite(c.get(k))}}


def _count(x) -> int:
    """A count from a comparison row (NaN, None or absent: 0)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0
    return int(v) if math.isfinite(v) else 0
