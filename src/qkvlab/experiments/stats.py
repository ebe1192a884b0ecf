"""Statistics over seeds: mean ± 95% CI (Student t), paired differences vs ``standard``.

No SciPy dependency: the t distribution's CDF is the regularized incomplete beta function,
evaluated by its continued fraction (Numerical Recipes §6.4), and the quantile by bisection.
With n seeds the CI uses n-1 degrees of freedom; with one seed there is no spread to measure
and CI and p-value are NaN (reported as such, never as 0).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

NAN = float("nan")


def _betacf(a: float, b: float, x: float) -> float:
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (bisection on the CDF; |error| < 1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: {q} must be in (0, 1)")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """``{n, mean, sd, half, lo, hi}``: mean ± t_{(1+level)/2, n-1} · sd/√n."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": NAN, "sd": NAN, "half": NAN, "lo": NAN, "hi": NAN}
    mean = sum(xs) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": NAN, "half": NAN, "lo": NAN, "hi": NAN}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "half": half, "lo": mean - half, "hi": mean + half}


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Paired difference a - b (same seeds): mean ± CI, two-sided t-test p-value, and the
    per-seed relative difference 100·(a/b - 1) in percent ± CI."""
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
            p = 2.0 * (1.0 - t_cdf(abs(t), d["n"] - 1))
    return {"diff": d["mean"], "diff_half": d["half"], "diff_lo": d["lo"], "diff_hi": d["hi"],
            "p": p, "rel_pct": rel["mean"], "rel_half": rel["half"], "n_pairs": d["n"]}


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
    groups: dict[tuple, dict[str, dict[Any, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
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
                row["baseline_params"] = _median([r["n_params"] for r in base.values() if r["n_params"]])
                row.update(paired([vals[s] for s in seeds], [bvals[s] for s in seeds], level))
            out.append(row)
    return out


def _order(key: tuple) -> list:
    """Numbers in numeric order (d_head 2 < 16), then everything else as text."""
    return [(k, (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))) for k, v in key]


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _median(xs: list) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


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
