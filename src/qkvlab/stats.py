"""Statistics over seeds: mean ± 95% CI (Student t), paired differences vs ``standard``.

The t quantiles and tail probabilities come from ``scipy.stats.t``; medians from the standard
library's ``statistics``. With n seeds the CI uses n-1 degrees of freedom; with one seed there
is no spread to measure and CI and p-value are NaN (reported as such, never as 0).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

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
    - ``undecided``: neither; ``seeds`` is then the smallest seed count at which the observed
      mean and sd would decide it one way or the other (None beyond ``max_seeds``, or with one
      seed, where no spread is known).

    Returns ``{status, half, lo, hi, lo_eq, hi_eq, significant, seeds}`` (``half``/``lo``/``hi``
    at ``level``; ``lo_eq``/``hi_eq`` the equivalence CI).

    Raises:
        ValueError: ``margin`` is not positive or ``level`` not in (0, 1).
    """
    if not (isinstance(margin, (int, float)) and margin > 0):
        raise ValueError(f"margin: {margin!r} must be a positive number")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: {level} must be in (0, 1)")
    eq_level = 1.0 - 2.0 * (1.0 - level)
    half, half_eq = t_half(sd, n, level), t_half(sd, n, eq_level)
    out = {"half": half, "lo": diff - half, "hi": diff + half, "lo_eq": diff - half_eq,
           "hi_eq": diff + half_eq, "significant": False, "seeds": None}
    if n < 2 or not math.isfinite(sd):
        return {**out, "status": "undecided"}
    out["significant"] = diff - half > 0 or diff + half < 0
    if -margin <= diff - half_eq and diff + half_eq <= margin:
        return {**out, "status": "equivalent"}
    if out["significant"]:
        return {**out, "status": "worse" if (diff > 0) == lower_is_better else "better"}

    def decided(k: int) -> bool:  # both half-widths shrink with k, so this is monotone in k
        return t_half(sd, k, level) < abs(diff) or t_half(sd, k, eq_level) < margin - abs(diff)

    if not decided(max_seeds):
        return {**out, "status": "undecided"}
    lo, hi = n, max_seeds  # decided(hi) holds, decided(lo) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return {**out, "status": "undecided", "seeds": hi}


def compare(rows: Iterable[dict[str, Any]], metric: str, *, baseline: str = "standard",
            design_key: str = "design", pair_on: str = "seed",
            level: float = 0.95) -> list[dict[str, Any]]:
    """One row per (group, design): mean ± CI of ``metric`` over seeds, and vs the baseline.

    ``rows`` come from ``Store.runs()``; a group is every tag except the design and the seed
    (task, arm, d_head, ...). Diverged runs are counted (``diverged``) but have no metric; the
    paired difference uses the seeds where both design and baseline finished.

    Returns:
        dicts with the group tags, ``design``, ``n``, ``mean``, ``half``, ``lo``, ``hi``,
        ``diverged``, ``n_params`` (median over seeds) and, for non-baseline designs,
        ``baseline_mean``, ``baseline_params`` and the fields of :func:`paired`.
    """
    groups: dict[tuple, dict[str, dict[Any, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict))
    for r in rows:
        tags = dict(r["tags"])
        design, seed = tags.pop(design_key, None), tags.pop(pair_on, None)
        key = tuple(sorted((k, _hashable(v)) for k, v in tags.items()))
        groups[key][design][seed] = r
    out = []
    for key, designs in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        base = designs.get(baseline, {})
        for design in sorted(designs, key=lambda d: (d != baseline, str(d))):
            runs = designs[design]
            vals = {s: r["final"].get(metric) for s, r in runs.items()
                    if r["status"] == "done" and r["final"].get(metric) is not None}
            row = {**dict(key), "design": design, **mean_ci(list(vals.values()), level),
                   "diverged": sum(r["status"] == "diverged" for r in runs.values()),
                   "n_params": _median([r["n_params"] for r in runs.values() if r["n_params"]])}
            if design != baseline and base:
                bvals = {s: r["final"].get(metric) for s, r in base.items()
                         if r["status"] == "done" and r["final"].get(metric) is not None}
                seeds = sorted(set(vals) & set(bvals), key=str)
                row["baseline_mean"] = mean_ci(list(bvals.values()), level)["mean"]
                row["baseline_params"] = _median([r["n_params"] for r in base.values()
                                                  if r["n_params"]])
                row.update(paired([vals[s] for s in seeds], [bvals[s] for s in seeds], level))
            out.append(row)
    return out


def _order(key: tuple) -> list:
    """Numbers in numeric order (d_head 2 < 16), then everything else as text."""
    return [(k, (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))) for k, v in key]


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _median(xs: list) -> float | None:
    """The median of ``xs`` (``statistics.median``), or None when it is empty."""
    return statistics.median(xs) if xs else None


def compare_frame(df, metric: str, by, *, baseline: str = "standard", design: str = "design",
                  pair_on: str = "seed", level: float = 0.95):
    """:func:`compare` over a tidy runs frame (``qkvlab.experiments.frames.runs_frame``).

    ``by`` names the columns that tell comparisons apart (e.g. task, arm, d_head); a missing
    value (NaN) in one of them means the tag is absent for that run. Returns a DataFrame with
    one :func:`compare` row each.
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
                                pair_on=pair_on, level=level))
