"""One comparison row vs standard -> its effect in the unit people quote and its verdict.

Units: losses as % perplexity (exp(Δ val loss) − 1: val losses are mean token cross-entropies),
accuracies in percentage points, chrF in points, throughput in %. The verdict applies
``stats.decide`` with the metric's practical margin from ``experiments.MARGINS`` (written down
before the runs): worse / better (the paired 95% CI excludes 0), equivalent (the 90% CI lies
inside ±margin: a TOST at 5%), undecided (neither; with the number of seeds that the observed
paired spread says would decide it), not learned (an accuracy task neither design learned).
Every table, figure and sentence of the report reads effects through :func:`effect`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qkvlab.stats import decide
from qkvlab.studies.qkv.experiments import MARGINS

# status -> the short word of the summary table
WORDS = {"worse": "worse", "better": "better", "equivalent": "equivalent",
         "undecided": "undecided", "not_learned": "not learned", "missing": "—"}


def _margins_text() -> str:
    return "; ".join(f"{m} ±{v.value:g}{'' if v.unit.startswith('%') else ' '}{v.unit}"
                     for m, v in MARGINS.items())


LEGEND = ("worse / better: the paired 95% CI over seeds excludes zero; equivalent: the 90% CI "
          "lies inside the practical margin written down before the runs (a TOST at 5%; "
          f"margins: {_margins_text()}); undecided: neither, with n≈ the number of seeds at "
          "which the observed paired spread would decide it; not learned: neither design "
          "reached 1.5× the task's chance accuracy, or half the perplexity of a context-free "
          "guess (the unigram entropy of the text), so the difference is between two guessers.")

LN2 = math.log(2)  # a loss task counts as learned once a design halves context-free perplexity


@dataclass(frozen=True)
class Scale:
    """How one metric's paired difference is read: ``field`` of the compare row (``diff`` or
    ``rel`` for the per-seed relative %), the display map and unit, the margin in raw units."""

    field: str
    show: Callable[[float], float]
    unit: str
    what: str
    margin: float


def _ppl(x: float) -> float:
    return 100.0 * math.expm1(x)


SCALES = {
    "val_loss": Scale("diff", _ppl, "%", "perplexity",
                      math.log1p(MARGINS["val_loss"].value / 100.0)),
    "accuracy": Scale("diff", lambda x: 100.0 * x, " pp", "accuracy",
                      MARGINS["accuracy"].value / 100.0),
    "chrf": Scale("diff", lambda x: x, " points", "chrF", MARGINS["chrf"].value),
    "bleu": Scale("diff", lambda x: x, " points", "BLEU", MARGINS["bleu"].value),
    "tokens_per_s": Scale("rel", lambda x: x, "%", "tokens/s", MARGINS["tokens_per_s"].value),
}


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def effect(c: dict | None, lower_is_better: bool = True, what: str | None = None,
           chance: float | None = None) -> dict[str, Any]:
    """The effect and verdict of one ``stats.compare`` row vs standard.

    Returns ``{text, status, value, half, lo, hi, seeds, unit}``: ``value`` ± ``half`` in the
    display unit (``lo``/``hi`` the 95% CI mapped there; for perplexity the map is not linear,
    so ``half`` is half of ``hi − lo``), ``seeds`` the count that would decide an undecided
    one. With ``chance`` (the task's chance level, ``results.chance``), a comparison where
    neither design got to 1.5× an accuracy task's guessing rate, or to half the perplexity of a
    loss task's context-free guess (val loss ``chance − ln 2``), is ``not_learned``.
    """
    metric = (c or {}).get("metric", "")
    sc = SCALES.get(metric, SCALES["val_loss"] if "loss" in metric else None)
    raw = (c or {}).get("diff" if sc is None or sc.field == "diff" else "rel_pct")
    sd = (c or {}).get("diff_sd" if sc is None or sc.field == "diff" else "rel_sd")
    none = {"value": None, "half": None, "lo": None, "hi": None, "seeds": None,
            "unit": "" if sc is None else sc.unit}
    if sc is None or not finite(raw):
        return {**none, "text": "not measured", "status": "missing"}
    if chance is not None and finite(c.get("mean")) and finite(c.get("baseline_mean")):
        if not lower_is_better and max(c["mean"], c["baseline_mean"]) < 1.5 * chance:
            return {**none, "status": "not_learned", "at_chance": True,
                    "text": f"both at chance ({100 * c['mean']:.1f}% vs standard "
                            f"{100 * c['baseline_mean']:.1f}%, chance {100 * chance:.1f}%: not "
                            f"learned, no verdict)"}
        if lower_is_better and min(c["mean"], c["baseline_mean"]) > chance - LN2:
            return {**none, "status": "not_learned", "at_chance": True,
                    "text": f"neither halves a context-free guess's perplexity (val loss "
                            f"{c['mean']:.3f} vs standard {c['baseline_mean']:.3f}, context-free "
                            f"{chance:.3f}: not learned, no verdict)"}
    what = what or sc.what
    n = int(c.get("n_pairs") or 0)
    d = decide(raw, sd if finite(sd) else float("nan"), n, sc.margin,
               lower_is_better=lower_is_better)
    value = sc.show(raw)
    margin = f"±{MARGINS[metric].value:g}{sc.unit}" if metric in MARGINS else ""
    if not finite(d["half"]):
        return {**none, "value": value, "status": "undecided",
                "text": f"{value:+.1f}{sc.unit} {what} from {n} seed (undecided: no CI)"}
    lo, hi = sc.show(d["lo"]), sc.show(d["hi"])
    half = (hi - lo) / 2
    out = {**none, "value": value, "half": half, "lo": lo, "hi": hi, "status": d["status"]}
    text = f"{value:+.1f}{sc.unit} ± {half:.1f}{sc.unit} {what}"
    if d["status"] == "equivalent":
        why = ("every seed scores the same for both" if raw == 0 and sd == 0 else
               f"90% CI inside {margin}" + ("; a real but smaller difference" if d["significant"]
                                            else ""))
        return {**out, "text": f"{text} (equivalent: {why})"}
    if d["status"] in ("worse", "better"):
        return {**out, "text": f"{text} ({d['status']})"}
    seeds = d["seeds"]
    more = f"≈{seeds} seeds would decide it" if seeds else "more than 10,000 seeds would be needed"
    return {**out, "seeds": seeds,
            "text": f"{text} (undecided: the CI straddles zero and reaches past {margin}; {more})"}


def cell(e: dict) -> str:
    """The summary-table cell of an effect: its word, value ± half and, if undecided, n≈."""
    if e["value"] is None:
        return WORDS[e["status"]]
    unit = e["unit"].strip()
    val = f" {e['value']:+.1f}" + ("" if e["half"] is None else f" ± {e['half']:.1f}") + \
        (unit if unit == "%" else f" {unit}")
    return WORDS[e["status"]] + val + (f" · n≈{e['seeds']}" if e.get("seeds") else "")
