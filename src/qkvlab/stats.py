"""Statistics over seeds: mean ± 95% CI (Student t), paired differences vs ``standard``.

The t quantiles and tail probabilities come from ``scipy.stats.t``; medians from the standard
library's ``statistics``. With n seeds the CI uses n-1 degrees of freedom; with one seed there
is no spread to measure and CI and p-value are NaN (reported as such, never as 0).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from scipy import stats as _scipy_stats

NAN = float("nan")


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """``{n, mean, sd, half, lo, hi}``: mean ± t_{(1+level)/2, n-1} · sd/√n.

    None and non-finite values are dropped; with one value ``sd``/``half``/``lo``/``hi`` are NaN.

    Raises:
        ValueError: ``level`` is not in (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: {level} must be in (0, 1)")
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": NAN, "sd": NAN, "half": NAN, "lo": NAN, "hi": NAN}
    mean = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": NAN, "half": NAN, "lo": NAN, "hi": NAN}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(_scipy_stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "half": half, "lo": mean - half, "hi": mean + half}


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Paired difference a - b (same seeds): mean ± CI, two-sided t-test p-value, and the
    per-seed relative difference 100·(a/b - 1) in percent ± CI.

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or ``level`` is not in (0, 1).
    """
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values vs {len(b)} baseline values; pair by seed")
    d = mean_ci([x - y for x, y in zip(a, b)], level)
    rel = mean_ci([100.0 * (x / y - 1.0) for x, y in zip(a, b) if y], level)
    p = NAN
    if d["n"] >= 2:
        if d["sd"] == 0:
            p = 1.0 if d["mean"] == 0 else 0.0
        else:
            t = d["mean"] / (d["sd"] / math.sqrt(d["n"]))
            p = 2.0 * float(_scipy_stats.t.sf(abs(t), d["n"] - 1))
    return {"diff": d["mean"], "diff_half": d["half"], "diff_lo": d["lo"], "diff_hi": d["hi"],
            "diff_sd": d["sd"], "p": p, "rel_pct": rel["mean"], "rel_half": rel["half"],
            "rel_sd": rel["sd"], "n_pairs": d["n"]}


def t_half(sd: float, n: int, level: float) -> float:
    """Half-width t_{(1+level)/2, n-1} · sd/√n of a two-sided ``level`` CI (NaN for n < 2)."""
    if n < 2 or not math.isfinite(sd):
        return NAN
    return float(_scipy_stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)


def power_t(diff: float, sd: float, n: int, level: float = 0.95) -> float:
    """Power of the two-sided one-sample (paired) t-test at ``1 − level`` with ``n`` pairs when
    the true mean difference is ``diff`` and the per-pair spread ``sd``: the noncentral t
    (``scipy.stats.nct``, noncentrality ``diff·√n/sd``) beyond ±t_{(1+level)/2, n−1}."""
    if n < 2 or not (math.isfinite(sd) and sd > 0):
        return NAN
    df, nc = n - 1, diff * math.sqrt(n) / sd
    tc = float(_scipy_stats.t.ppf(0.5 + level / 2.0, df))
    return _nct_cdf(-tc, df, nc) + 1.0 - _nct_cdf(tc, df, nc)


def power_tost(diff: float, sd: float, n: int, margin: float, level: float = 0.95) -> float:
    """Power of the TOST at ``1 − level`` (both one-sided t-tests against ±``margin``) with
    ``n`` pairs when the true difference is ``diff`` and the spread ``sd``: the noncentral-t
    approximation P(T₊ > t_c) − P(T₋ > −t_c) (each statistic alone noncentral t; PowerTOST's
    ``method="nct"``), clipped at 0."""
    if n < 2 or not (math.isfinite(sd) and sd > 0):
        return NAN
    df, se = n - 1, sd / math.sqrt(n)
    tc = float(_scipy_stats.t.ppf(level, df))
    return max(0.0, _nct_cdf(-tc, df, (diff - margin) / se)
               - _nct_cdf(tc, df, (diff + margin) / se))


def _nct_cdf(x: float, df: int, nc: float) -> float:
    """``scipy.stats.nct.cdf``; where it returns NaN (large df and noncentrality), the normal
    limit Φ(x − nc), which is what the noncentral t tends to there."""
    p = float(_scipy_stats.nct.cdf(x, df, nc))
    return p if math.isfinite(p) else float(_scipy_stats.norm.cdf(x - nc))


def seeds_for_power(diff: float, sd: float, margin: float, *, level: float = 0.95,
                    power: float = 0.8,
                    max_seeds: int = 10_000) -> tuple[int | None, str | None]:
    """The fewest pairs at which a new experiment would decide a difference with ``power``
    if the true difference and spread were ``diff`` and ``sd``: the smaller of the seed
    count for the two-sided paired t-test (``power_t``, "difference") and for the TOST
    against ±``margin`` (``power_tost``, "equivalence"), both at ``1 − level``. Returns
    ``(seeds, which)``, or ``(None, None)`` beyond ``max_seeds`` or without a spread.
    """
    if not (math.isfinite(sd) and math.isfinite(diff)) or sd <= 0:
        return None, None

    def smallest(pw) -> int | None:  # each power grows with n: double, then bisect
        lo, hi = 1, 2
        while not pw(hi) >= power:
            if hi >= max_seeds:
                return None
            lo, hi = hi, min(2 * hi, max_seeds)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if pw(mid) >= power else (mid, hi)
        return hi

    found = [(k, which) for k, which in (
        (smallest(lambda k: power_t(diff, sd, k, level)), "difference"),
        (smallest(lambda k: power_tost(diff, sd, k, margin, level)), "equivalence"))
        if k is not None]
    return min(found) if found else (None, None)


def tost_p(diff: float, sd: float, n: int, margin: float) -> float:
    """The TOST p-value for |true difference| ≥ ``margin``: the larger of the two one-sided
    t-test p-values (against −margin, greater; against +margin, less); NaN for n < 2."""
    if n < 2 or not math.isfinite(sd):
        return NAN
    if sd == 0:
        return 0.0 if abs(diff) < margin else 1.0
    se = sd / math.sqrt(n)
    return max(float(_scipy_stats.t.sf((diff + margin) / se, n - 1)),
               float(_scipy_stats.t.cdf((diff - margin) / se, n - 1)))


def t_p(diff: float, sd: float, n: int) -> float:
    """The two-sided one-sample t-test p-value of a mean difference against 0 (NaN, n < 2)."""
    if n < 2 or not math.isfinite(sd):
        return NAN
    if sd == 0:
        return 1.0 if diff == 0 else 0.0
    return 2.0 * float(_scipy_stats.t.sf(abs(diff) / (sd / math.sqrt(n)), n - 1))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: sorted ascending,
    the i-th (from 0) of m is multiplied by m − i, capped at 1, and made non-decreasing along
    the order. Reject a hypothesis at α when its adjusted p ≤ α: this keeps the chance of any
    false rejection in the family at α whatever the dependence between the tests. NaN entries
    stay NaN and do not count in m.
    """
    idx = sorted((i for i, p in enumerate(ps) if p is not None and math.isfinite(p)),
                 key=lambda i: ps[i])
    out, run, m = [NAN] * len(ps), 0.0, len(idx)
    for rank, i in enumerate(idx):
        run = max(run, min(1.0, (m - rank) * float(ps[i])))
        out[i] = run
    return out


def decide(diff: float, sd: float, n: int, margin: float, *, lower_is_better: bool = True,
           level: float = 0.95, max_seeds: int = 10_000) -> dict[str, Any]:
    """The verdict on a paired difference (design − baseline over ``n`` seeds, per-seed
    differences with standard deviation ``sd``) against a practical ``margin`` (> 0, same unit).

    Rules, in this order (``α = 1 − level``):

    - ``equivalent``: the ``1 − 2α`` CI (90% at level 0.95) lies inside ``±margin``: both
      one-sided tests of the TOST procedure reject a difference of ``margin`` or more at ``α``.
      This holds even when the ``level`` CI excludes 0: a real difference smaller than the
      margin is a difference that does not matter (``significant`` says so).
    - ``worse`` / ``better``: the ``level`` CI excludes 0 (worse is the direction that
      ``lower_is_better`` says is bad).
    - ``undecided``: neither; ``seeds`` is then the seed count at which a new experiment would
      decide it with 80% power if the true mean and sd were the observed ones
      (``seeds_for_power``: the paired t-test or the TOST, whichever needs fewer; None beyond
      ``max_seeds``, or with one seed, where no spread is known).

    Returns ``{status, half, lo, hi, lo_eq, hi_eq, significant, seeds, p, p_tost, p_decided}``
    (``half``/``lo``/``hi`` at ``level``; ``lo_eq``/``hi_eq`` the equivalence CI; ``p`` the
    two-sided t-test's p against 0, ``p_tost`` the TOST's, ``p_decided`` the p of the test
    that decided the status: ``p_tost`` for equivalent, ``p`` for worse/better, the smaller
    for undecided; what a multiplicity correction such as :func:`holm` adjusts).

    Raises:
        ValueError: ``margin`` is not positive or ``level`` not in (0, 1).
    """
    if not (isinstance(margin, (int, float)) and margin > 0):
        raise ValueError(f"margin: {margin!r} must be a positive number")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: {level} must be in (0, 1)")
    eq_level = 1.0 - 2.0 * (1.0 - level)
    half, half_eq = t_half(sd, n, level), t_half(sd, n, eq_level)
    p, p_eq = t_p(diff, sd, n), tost_p(diff, sd, n, margin)
    out = {"half": half, "lo": diff - half, "hi": diff + half, "lo_eq": diff - half_eq,
           "hi_eq": diff + half_eq, "significant": False, "seeds": None, "p": p,
           "p_tost": p_eq, "p_decided": min(p, p_eq)}
    if n < 2 or not math.isfinite(sd):
        return {**out, "status": "undecided", "p_decided": NAN}
    out["significant"] = diff - half > 0 or diff + half < 0
    if -margin <= diff - half_eq and diff + half_eq <= margin:
        return {**out, "status": "equivalent", "p_decided": p_eq}
    if out["significant"]:
        return {**out, "status": "worse" if (diff > 0) == lower_is_better else "better",
                "p_decided": p}
    seeds, _ = seeds_for_power(diff, sd, margin, level=level, max_seeds=max_seeds)
    return {**out, "status": "undecided", "seeds": seeds}


LOST = ("diverged", "failed")  # finished without a result: each one counts, see compare


def compare(rows: Iterable[dict[str, Any]], metric: str, *, baseline: str = "standard",
            design_key: str = "design", pair_on: str = "seed", level: float = 0.95,
            lower_is_better: bool | None = None,
            failed: float | Callable[[dict], float | None] | None = None) -> list[dict[str, Any]]:
    """One row per (group, design): mean ± CI of ``metric`` over seeds, and vs the baseline.

    ``rows`` come from ``Store.runs()``; a group is every tag except the design and the seed
    (task, arm, d_head, ...). Every run counts: a diverged or failed run (``LOST``) enters with
    the worst value its group allows, the worse (``lower_is_better`` says which way) of
    ``failed`` (a number, or a function of the group's tags; e.g. the task's chance level) and
    the worst value any finished run of the group (any design, any seed) reached; with
    neither, or without a direction (``lower_is_better`` None), it cannot be scored and is only
    counted. The worst case keeps every CI finite and puts a lost run at the bad end of its
    seed's paired difference, whichever design lost it.
    Pending and running runs are not results and are left out.

    Returns:
        dicts with the group tags, ``design``, ``n`` (runs counted, lost ones included),
        ``mean``, ``half``, ``lo``, ``hi``, ``diverged``, ``failed`` (counts), ``lost_value``
        (the value a lost run entered with, None if none), ``n_params`` (median over seeds) and,
        for non-baseline designs, ``baseline_mean``, ``baseline_params``, ``baseline_lost``
        and the fields of :func:`paired`.
    """
    groups: dict[tuple, dict[str, dict[Any, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict))
    for r in rows:
        tags = dict(r["tags"])
        design, seed = tags.pop(design_key, None), tags.pop(pair_on, None)
        key = tuple(sorted((k, _hashable(v)) for k, v in tags.items()))
        groups[key][design][seed] = r
    worst = max if lower_is_better else min
    out = []
    for key, designs in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        done = {d: {s: r["final"][metric] for s, r in runs.items() if r["status"] == "done"
                    and _finite(r["final"].get(metric))} for d, runs in designs.items()}
        floor = [v for d in done.values() for v in d.values()]
        if any(r["status"] in LOST for runs in designs.values() for r in runs.values()):
            given = failed(dict(key)) if callable(failed) else failed  # only where needed
            floor += [given] if _finite(given) else []
        lost_value = worst(floor) if floor and lower_is_better is not None else None

        def scored(d: str) -> dict[Any, float]:  # finished values and lost runs at lost_value
            lost = {s: lost_value for s, r in designs[d].items()
                    if r["status"] in LOST and lost_value is not None}
            return {**done[d], **lost}

        base = scored(baseline) if baseline in designs else {}
        for design in sorted(designs, key=lambda d: (d != baseline, str(d))):
            runs, vals = designs[design], scored(design)
            n_lost = sum(r["status"] in LOST for r in runs.values())
            row = {**dict(key), "design": design, **mean_ci(list(vals.values()), level),
                   "diverged": sum(r["status"] == "diverged" for r in runs.values()),
                   "failed": sum(r["status"] == "failed" for r in runs.values()),
                   "lost_value": lost_value if n_lost else None,
                   "n_params": _median([r["n_params"] for r in runs.values() if r["n_params"]])}
            if design != baseline and baseline in designs:
                b = designs[baseline]
                seeds = sorted(set(vals) & set(base), key=str)
                row["baseline_mean"] = mean_ci(list(base.values()), level)["mean"]
                row["baseline_params"] = _median([r["n_params"] for r in b.values()
                                                  if r["n_params"]])
                row["baseline_lost"] = sum(b[s]["status"] in LOST for s in seeds)
                row["lost"] = sum(runs[s]["status"] in LOST for s in seeds)
                row.update(paired([vals[s] for s in seeds], [base[s] for s in seeds], level))
            out.append(row)
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _order(key: tuple) -> list:
    """Numbers in numeric order (d_head 2 < 16), then everything else as text."""
    return [(k, (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))) for k, v in key]


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _median(xs: list) -> float | None:
    """The median of ``xs`` (``statistics.median``), or None when it is empty."""
    return statistics.median(xs) if xs else None


def compare_frame(df, metric: str, by, *, baseline: str = "standard", design: str = "design",
                  pair_on: str = "seed", level: float = 0.95, lower_is_better: bool | None = None,
                  failed: float | Callable[[dict], float | None] | None = None):
    """:func:`compare` over a tidy runs frame (``qkvlab.experiments.frames.runs_frame``).

    ``by`` names the columns that tell comparisons apart (e.g. task, arm, d_head); a missing
    value (NaN) in one of them means the tag is absent for that run; ``lower_is_better`` and
    ``failed`` say what a diverged or failed run scores (:func:`compare`). Returns a DataFrame
    with one :func:`compare` row each.
    """
    import pandas as pd

    def value(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, float) and v.is_integer():
            return int(v)  # an integer tag that pandas stored as float next to NaN
        return v.item() if hasattr(v, "item") else v

    rows = []
    for r in df.to_dict("records"):
        tags = {k: value(r.get(k)) for k in by}
        tags = {k: v for k, v in tags.items() if v is not None}
        m = value(r.get(metric))
        rows.append({"tags": {**tags, design: r[design], pair_on: value(r[pair_on])},
                     "status": r["status"], "n_params": value(r.get("n_params")),
                     "final": {} if m is None else {metric: m}})
    return pd.DataFrame(compare(rows, metric, baseline=baseline, design_key=design,
                                pair_on=pair_on, level=level, lower_is_better=lower_is_better,
                                failed=failed))
