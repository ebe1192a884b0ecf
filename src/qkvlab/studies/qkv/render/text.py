"""Words and numbers for the page: an effect as a phrase or a table cell, numbers with their
CIs, and the legend that explains the verdict words once. Formats records; computes nothing
but the mean ± CI of a list it is handed to print.
"""

from __future__ import annotations

import math

from qkvlab.stats import mean_ci
from qkvlab.studies.qkv.compute.effects import Effect, Status, finite
from qkvlab.studies.qkv.plan.vocab import METRICS

# status -> the short word of the summary table
WORDS = {Status.WORSE: "worse", Status.BETTER: "better", Status.EQUIVALENT: "equivalent",
         Status.UNDECIDED: "undecided", Status.NOT_LEARNED: "not learned", Status.MISSING: "—"}


def _margins_text() -> str:
    return "; ".join(f"{name} ±{m.margin:g}{'' if m.margin_unit.startswith('%') else ' '}"
                     f"{m.margin_unit}" for name, m in METRICS.items())


LEGEND = ("worse / better: the paired 95% CI over seeds excludes zero; equivalent: the 90% CI "
          "lies inside the practical margin written down before the runs (a TOST at 5%; "
          f"margins: {_margins_text()}); undecided: neither, with n≈ the number of seeds at "
          "which the observed paired spread would decide it; not learned: neither design "
          "reached 1.5× the task's chance accuracy, or half the perplexity of a context-free "
          "guess (the unigram entropy of the text), so the difference is between two guessers.")


def said(e: Effect) -> str:
    """An effect as the phrase a verdict sentence or a table quotes: value ± half in its unit
    and what, then the verdict and why."""
    if e.status is Status.MISSING:
        return "not measured"
    if e.status is Status.NOT_LEARNED:
        if not e.lower_is_better:
            return (f"both at chance ({100 * e.mean:.1f}% vs standard "
                    f"{100 * e.baseline_mean:.1f}%, chance {100 * e.chance:.1f}%: not learned, "
                    f"no verdict)")
        return (f"neither halves a context-free guess's perplexity (val loss {e.mean:.3f} vs "
                f"standard {e.baseline_mean:.3f}, context-free {e.chance:.3f}: not learned, "
                f"no verdict)")
    if e.half is None:
        return f"{e.value:+.1f}{e.unit} {e.what} from {e.n} seed (undecided: no CI)"
    text = f"{e.value:+.1f}{e.unit} ± {e.half:.1f}{e.unit} {e.what}"
    if e.status is Status.EQUIVALENT:
        why = ("every seed scores the same for both" if e.identical else
               f"90% CI inside {e.margin}" + ("; a real but smaller difference" if e.significant
                                              else ""))
        return f"{text} (equivalent: {why})"
    if e.status in (Status.WORSE, Status.BETTER):
        return f"{text} ({e.status.value})"
    more = (f"≈{e.seeds} seeds would decide it" if e.seeds else
            "more than 10,000 seeds would be needed")
    return f"{text} (undecided: the CI straddles zero and reaches past {e.margin}; {more})"


def cell(e: Effect) -> str:
    """The summary-table cell of an effect: its word, value ± half and, if undecided, n≈."""
    if e.value is None:
        return WORDS[e.status]
    unit = e.unit.strip()
    val = f" {e.value:+.1f}" + ("" if e.half is None else f" ± {e.half:.1f}") + \
        (unit if unit == "%" else f" {unit}")
    return WORDS[e.status] + val + (f" · n≈{e.seeds}" if e.seeds else "")


def num(x, digits: int = 3) -> str:
    """A number for a table cell: 3 significant digits, thousands separators, '—' if absent."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def pm(mean, half, digits: int = 3) -> str:
    return num(mean, digits) if half is None or not math.isfinite(half) else \
        f"{num(mean, digits)} ± {num(half, 2)}"


def ci_text(values: list[float], fmt: str = "{:.3g}", unit: str = "") -> str:
    """``mean ± half`` over seeds (``mean`` alone, with the seed count, if only one)."""
    m = mean_ci(values)
    if not m["n"]:
        return "n/a"
    if not finite(m["half"]):
        return f"{fmt.format(m['mean'])}{unit} (1 seed)"
    return f"{fmt.format(m['mean'])}{unit} ± {fmt.format(m['half'])}{unit}"
