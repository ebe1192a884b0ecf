"""The size trend tested before it is believed (issue 39, item 4). Written down before any
held-out cell was trained:

- **The cells**: the scaling profile's size cells where standard uses attention
  (``scaling.used_sizes``), each a model size N (the standard model's non-embedding
  parameters) with its seeds, a seed entering where standard and every design have a loss
  (a lost run at the study's rule, ``scaling.losses``). The fit reads the cells with at most
  1/``HOLDOUT`` of the largest's parameters; the held-out cells are those with at least
  ``HOLDOUT`` times the parameters of every cell the fit reads. With fewer than ``MIN_FIT`` fit
  cells, or no held-out cell, there is no back-test, and ``reason`` says why.
- **The forms**, each a prediction of a design's gap (% perplexity per token) at size N:
  - ``line``: the cell means' gap% = a + b·log10 N (the study's size fit, ``scaling.fit``);
  - ``multiplier``: standard's mean test loss L(N) = E + A·(N/N0)^-α over the cells, each
    design a multiplier on its effective parameters, L_d(N) = L(m_d·N) (m_d^-α by least
    squares on the design's cell means, closed form); gap%(N) = 100·(exp(L(m_d·N) − L(N)) − 1).
    A tie is then worth a fixed share of standard's parameters, as in "Scaling Laws Meet Model
    Architecture" (arXiv 2510.18245); its gap shrinks as N^-α by construction.
- **The prediction interval** for a held-out cell's mean gap over its seeds: ``BOOT`` resamples
  of the seeds within each fit cell (a seed's runs of every design together, the pairing of the
  gap), the form refit on each, plus the held-out mean's own scatter (normal, sd: the fit
  cells' pooled seed sd of the design's gap, over √seeds held out); its ``LEVEL`` percentiles.
  A resample whose fit fails is counted (``failed``) and left out.
- **Passing**: a form passes for a design where every held-out cell's measured mean gap lies
  inside its interval. Only a passing form is extrapolated (``predictions``: refit on every
  used cell, the interval the resamples' percentiles at the target); the report says which
  passed, or that none did, or why none could be tested.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from qkvlab.stats import mean_ci
from qkvlab.studies.qkv.compute import scaling as S
from qkvlab.studies.qkv.plan.vocab import ppl_pct

__all__ = ["HOLDOUT", "MIN_FIT", "BOOT", "LEVEL", "FORMS", "MEASURE", "split", "backtest",
           "kind"]
MEASURE = "scaling_backtest"  # the measure the study stores its records as
HOLDOUT = 3.0  # a held-out cell has >= 3x the parameters of every cell the fit reads
MIN_FIT = 4  # the multiplier form's standard curve has 3 parameters: one cell more
BOOT = 1000
LEVEL = 0.95
FORMS = ("line", "multiplier")
N0 = 1e5  # the multiplier form's reference size (conditions the fit)
FIT_ERRORS = (RuntimeError, ValueError, np.linalg.LinAlgError)  # a fit that did not converge


def split(sizes) -> tuple[list[float], list[float]]:
    """(fit, held-out) among the cells' parameter counts ``sizes``, by the rule above."""
    sizes = sorted(set(float(n) for n in sizes))
    fit = [n for n in sizes if sizes and n * HOLDOUT <= sizes[-1]]
    held = [n for n in sizes if fit and n >= HOLDOUT * fit[-1]]
    return fit, held


def _cells(runs: pd.DataFrame, chance: float | None) -> tuple[dict, list[str]]:
    """{N: [seeds × (standard, *designs)] losses} over the used size cells, and the designs."""
    loss = S.losses(runs, chance)
    loss = loss[loss.cell == "size"] if not loss.empty else loss
    if loss.empty:
        return {}, []
    used = S.used_sizes(S.cell_summary(S.gaps(loss)))
    if used is not None:
        loss = loss[[(int(w), int(d)) in used for w, d in zip(loss.d_model, loss.n_layers)]]
    designs = [d for d in S.DESIGNS if d in set(loss.design)]
    wide = loss.pivot_table(index=["cell_params", "seed"], columns="design", values="loss")
    cols = [S.BASELINE, *designs]
    if S.BASELINE not in wide:
        return {}, []
    wide = wide[cols].dropna()
    return ({float(n): g.to_numpy(dtype=float) for n, g in wide.groupby(level=0)}, designs)


def _gaps(x: np.ndarray) -> np.ndarray:
    """Per seed (rows) and design (columns): the gap % to standard (column 0)."""
    return ppl_pct(x[:, 1:] - x[:, :1])


def _fit(cells: dict, form: str, p0=None):
    """The form fitted on ``cells`` ({N: losses}): a function N -> per-design gap % array,
    with the standard curve's (E, A, α) as ``.params`` for the multiplier form (``p0``: where
    its search starts, the full data's fit for a resample)."""
    ns = np.array(sorted(cells))
    if form == "line":
        g = np.stack([_gaps(cells[n]).mean(axis=0) for n in ns])  # cells × designs
        b, a = np.polyfit(np.log10(ns), g, 1)
        return lambda n: a + b * math.log10(n)
    from scipy.optimize import curve_fit

    means = np.stack([cells[n].mean(axis=0) for n in ns])  # cells × (standard, designs)
    std = means[:, 0]

    def curve(n, e, a, al):
        return e + a * (n / N0) ** (-al)

    top = float(std.min())
    start = (0.9 * top, max(float(np.ptp(std)), 1e-3), 0.3) if p0 is None else \
        (min(p0[0], top * (1 - 1e-9)), p0[1], p0[2])
    (e, a, al), _ = curve_fit(curve, ns, std, p0=start, maxfev=20000,
                              bounds=([0.0, 0.0, 1e-3], [top, np.inf, 3.0]))
    z = a * (ns / N0) ** (-al)
    u = np.maximum(((means[:, 1:] - e) * z[:, None]).sum(axis=0) / (z ** 2).sum(), 1e-12)

    def gap(n):
        return 100.0 * np.expm1(a * (n / N0) ** (-al) * (u - 1.0))
    gap.params = (e, a, al)
    return gap


def _boot(cells: dict, form: str, at: list[float], rng) -> tuple[np.ndarray, int]:
    """[BOOT × len(at) × designs] refits on seeds resampled within each cell, and how many
    resamples failed to fit (left out)."""
    out, failed = [], 0
    p0 = getattr(_fit(cells, form), "params", None)
    for _ in range(BOOT):
        res = {n: x[rng.integers(0, len(x), len(x))] for n, x in cells.items()}
        try:
            f = _fit(res, form, p0)
            out.append([f(n) for n in at])
        except FIT_ERRORS:
            failed += 1
    return np.array(out), failed


def backtest(runs: pd.DataFrame, chance: float | None = None, seed: int = 0) -> list[dict]:
    """What the study stores as measure ``MEASURE``: per form, design and held-out cell a
    ``heldout`` record (fit cells, predicted, lo, hi, measured ± half, covered, failed); for
    each form that passes a design, its ``prediction`` records at ``scaling.TARGETS``; where no
    back-test is possible one ``untested`` record with the ``reason``."""
    cells, designs = _cells(runs, chance)
    fit_n, held_n = split(cells)
    if len(fit_n) < MIN_FIT or not held_n:
        span = (f"{min(cells):,.0f} to {max(cells):,.0f} parameters, {max(cells) / min(cells):.1f}×"
                if cells else "none")
        return [{"kind": "untested", "reason": (
            f"the sizes where standard uses attention ({span}) hold {len(fit_n)} cell(s) at "
            f"≤ 1/{HOLDOUT:g} of the largest, and a back-test needs {MIN_FIT} with a cell "
            f"≥ {HOLDOUT:g}× beyond them")}]
    q = (100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2)
    fit_cells = {n: cells[n] for n in fit_n}
    pooled = np.sqrt(sum(((g - g.mean(axis=0)) ** 2).sum(axis=0) for g in map(_gaps, (
        fit_cells[n] for n in fit_n))) / sum(len(x) - 1 for x in fit_cells.values()))
    out = []
    for form in FORMS:
        rng = np.random.default_rng(seed)
        try:
            point = _fit(fit_cells, form)
            boot, failed = _boot(fit_cells, form, held_n, rng)
        except FIT_ERRORS:  # the form cannot be fitted to these cells: it cannot pass
            point, boot, failed = None, np.empty((0, len(held_n), len(designs))), BOOT
        for j, n in enumerate(held_n):
            k = len(cells[n])
            if len(boot):
                noise = rng.normal(0.0, 1.0, boot.shape[0])[:, None] * pooled / math.sqrt(k)
                lo, hi = np.percentile(boot[:, j, :] + noise, q, axis=0)
            else:  # every resample failed: no interval, so no pass
                lo = hi = np.full(len(designs), np.nan)
            got = _gaps(cells[n])
            for i, d in enumerate(designs):
                ci = mean_ci(got[:, i].tolist())
                out.append({"kind": "heldout", "form": form, "design": d, "fit_cells": len(fit_n),
                            "fit_min": fit_n[0], "fit_max": fit_n[-1], "held_params": n,
                            "n_held": k, "lo": float(lo[i]),
                            "predicted": float(point(n)[i]) if point else float("nan"),
                            "hi": float(hi[i]), "measured": ci["mean"],
                            "measured_half": _finite(ci["half"]),
                            "covered": bool(lo[i] <= ci["mean"] <= hi[i]), "failed": failed})
        ok = [d for d in designs if all(r["covered"] for r in out
                                        if r["form"] == form and r["design"] == d)]
        if ok:
            try:
                out += _predict(cells, form, designs, ok, seed)
            except FIT_ERRORS:  # passed, but cannot be refitted on every cell: not extrapolated
                pass
    return out


def _predict(cells: dict, form: str, designs: list[str], ok: list[str], seed: int) -> list[dict]:
    """The ``prediction`` records of ``form`` for the designs ``ok`` it passed, refit on every
    used cell."""
    point = _fit(cells, form)
    boot, failed = _boot(cells, form, list(S.TARGETS), np.random.default_rng(seed))
    lo, hi = np.percentile(boot, (100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2), axis=0)
    return [{"kind": "prediction", "form": form, "design": d, "target": t,
             "gap_pct": float(point(t)[i]), "lo": float(lo[j, i]), "hi": float(hi[j, i]),
             "fit_cells": len(cells), "failed": failed}
            for j, t in enumerate(S.TARGETS) for i, d in enumerate(designs) if d in ok]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def kind(records: pd.DataFrame, name: str) -> pd.DataFrame:
    """The stored records of one ``kind`` (``heldout``, ``prediction``: the forms that passed,
    ``untested``); empty where the store has none."""
    if records.empty or "kind" not in records:
        return pd.DataFrame()
    return records[records.kind == name].reset_index(drop=True)
