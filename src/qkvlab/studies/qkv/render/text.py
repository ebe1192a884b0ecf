"""Words and numbers for the page: an effect as a phrase or a table cell, numbers with their
CIs, and the legend that explains the verdict words once. Formats records; computes nothing
but the mean ± CI of a list it is handed to print.
"""

from __future__ import annotations

import math

from qkvlab.report.blocks import Para
from qkvlab.studies.qkv.compute.effects import Effect, Status, finite
from qkvlab.studies.qkv.compute.findings import seed_summary
from qkvlab.studies.qkv.plan.edges import EDGE_STEPS
from qkvlab.studies.qkv.plan.vocab import METRICS

# status -> the short word of the summary table
WORDS = {Status.WORSE: "worse", Status.BETTER: "better", Status.EQUIVALENT: "equivalent",
         Status.UNDECIDED: "undecided", Status.NOT_LEARNED: "not learned",
         Status.ATTENTION_UNUSED: "attention not used at this budget", Status.MISSING: "—"}


def _margins_text() -> str:
    return "; ".join(f"{name} ±{m.margin:g}{'' if m.margin_unit.startswith('%') else ' '}"
                     f"{m.margin_unit}" for name, m in METRICS.items())


LEGEND = ("worse / better: the paired 95% CI over seeds excludes zero; equivalent: the 90% CI "
          "lies inside the practical margin written down before the runs (a TOST at 5%; "
          f"margins: {_margins_text()}); undecided: neither, with n≈ the seeds a new experiment "
          "would need for 80% power to decide it (paired t-test or TOST, whichever needs "
          "fewer) if the true effect and spread were the observed ones. Each question's "
          "headline comparisons (this table's cells, the matched arms the headlines quote) are "
          "one family, planned before the runs, corrected by Holm at 5%: the verdict shown is "
          "the corrected one, p the raw p of the test that decided it (TOST for equivalent, "
          "the paired t-test otherwise), and a verdict that does not survive reads undecided "
          "with the raw verdict beside it; a headline comparison's n≈ is at 5%/m, Holm's "
          "strictest level, so those seeds would decide it after the correction too. Other "
          "verdicts on the page are at 5% each, uncorrected. lost: runs that diverged or failed; "
          "each counts as its seed's worst outcome (the task's chance level, or the worst "
          "finished run of the comparison if that is worse), never dropped. not learned: "
          "neither design reached 1.5× the task's chance accuracy, or half the perplexity of a "
          "context-free guess (the unigram entropy of the text), so the difference is between "
          "two guessers. attention not used at this budget: standard does not beat the "
          "attention-free control (the same model with fixed uniform scores, no Q or K, trained "
          "on the same seeds) by more than the margin, its paired 95% CI past it; no verdict on "
          "a design whose scores differ, and the verdict the test alone gave is shown beside "
          "it; such a comparison still counts in its Holm family. Throughput is not gated.")


def splits_text(profile) -> str:
    """Which split each number comes from, with the profile's test batches (``vocab.reported``)."""
    n = getattr(profile, "test_batches", None)
    size = (f"{n} batch{'es' if n != 1 else ''} per run" if n
            else "no test batches at this profile")
    return (f"Rates and every choice on val; reported numbers on the test split ({size}, "
            f"scored once on each finished run's final model: data no choice saw). The per-step "
            f"losses (trained how far, the half-budget gap) and the 'has it learned' caveats "
            f"read val.")


def _p(x: float | None) -> str:
    return "—" if x is None else f"{x:.2g}"


def _lost(e: Effect) -> str:
    """"1 of 3 lost by standard, …": the seeds each side lost (diverged or failed)."""
    parts = [f"{k} of {e.n} lost by {who}" for k, who in ((e.lost, "the design"),
                                                          (e.baseline_lost, "standard")) if k]
    return ", ".join(parts)


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
        what = "bits per character" if "bits" in e.unit else "test loss"
        return (f"neither halves a context-free guess's perplexity ({what} {e.mean:.3f} vs "
                f"standard {e.baseline_mean:.3f}, context-free {e.chance:.3f}: not learned, "
                f"no verdict)")
    if e.status is Status.ATTENTION_UNUSED:
        return unused(e)
    if e.half is None:
        return f"{e.value:+.{e.digits}f}{e.unit}{_what(e)} from {e.n} seed (undecided: no CI)"
    text = f"{e.value:+.{e.digits}f}{e.unit} ± {e.half:.{e.digits}f}{e.unit}{_what(e)}"
    holm = (f"; p {_p(e.p_adj)} after Holm over {e.family}'s {e.family_m}"
            if e.family else "")
    lost = f"; {_lost(e)}, counted as worst" if _lost(e) else ""
    if e.status is Status.EQUIVALENT:
        why = ("every seed scores the same for both" if e.identical else
               f"90% CI inside {e.margin}" + ("; a real but smaller difference" if e.significant
                                              else ""))
        return f"{text} (equivalent: {why}{holm}{lost})"
    if e.status in (Status.WORSE, Status.BETTER):
        return f"{text} ({e.status.value}{holm}{lost})"
    more = (f"≈{e.seeds} seeds would give 80% power" if e.seeds else
            "more than 10,000 seeds would be needed")
    if e.raw_status is not None:
        return (f"{text} (undecided: {e.raw_status.value} at p {_p(e.p)} alone, not significant "
                f"after Holm over {e.family}'s {e.family_m} headline comparisons, adjusted p "
                f"{_p(e.p_adj)}; {more}{lost})")
    return (f"{text} (undecided: the CI straddles zero and reaches past {e.margin}; "
            f"{more}{lost})")


def _what(e: Effect) -> str:
    """" perplexity" after a value in %; nothing where the unit says it all (bits/char)."""
    return f" {e.what}" if e.what else ""


def control_text(e: Effect) -> str:
    """The control vs standard that the gate read, e.g. "+1.2 ± 3.0%"."""
    if e.control_value is None:
        return "no CI"
    u = e.control_unit
    half = "" if e.control_half is None else f" ± {e.control_half:.{e.digits}f}{u}"
    return f"{e.control_value:+.{e.digits}f}{u}{half}"


def unused(e: Effect) -> str:
    """An ``ATTENTION_UNUSED`` effect in words: the gate, then what the test alone said."""
    n = e.digits
    text = (f"{e.value:+.{n}f}{e.unit}"
            + ("" if e.half is None else f" ± {e.half:.{n}f}{e.unit}") + _what(e))
    raw = "" if e.raw_status is None else \
        f"; its own test would read {e.raw_status.value}" + \
        ("" if e.p is None else f" at p {_p(e.p)}")
    lost = f"; {_lost(e)}, counted as worst" if _lost(e) else ""
    return (f"{text} (attention not used at this budget: standard does not beat the "
            f"attention-free control by more than the margin: the control vs standard is "
            f"{control_text(e)}{' ' + e.control_what if e.control_what else ''}; no verdict"
            f"{raw}{lost})")


def cell(e: Effect) -> str:
    """The summary-table cell of an effect: its (corrected) word, value ± half, n≈ if
    undecided, the seeds lost, and for a family member the raw p (and the raw verdict, where
    the correction undid it)."""
    if e.value is None:
        return WORDS[e.status]
    unit = e.unit.strip()
    val = f" {e.value:+.{e.digits}f}" + ("" if e.half is None else f" ± {e.half:.{e.digits}f}") + \
        (unit if unit == "%" else f" {unit}")
    out = WORDS[e.status] + val + (f" · n≈{e.seeds}" if e.seeds else "")
    out += f" · {_lost(e)}" if _lost(e) else ""
    if e.status is Status.ATTENTION_UNUSED:
        return out + f" (control {control_text(e)} vs standard" + \
            ("" if e.raw_status is None else f"; own test: {e.raw_status.value}") + ")"
    if e.raw_status is not None:
        return out + f" ({e.raw_status.value} at p {_p(e.p)}, not after Holm)"
    return out + (f" (p {_p(e.p)})" if e.family else "")


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
    m = seed_summary(values)
    if not m.n:
        return "n/a"
    if not finite(m.half):
        return f"{fmt.format(m.mean)}{unit} (1 seed)"
    return f"{fmt.format(m.mean)}{unit} ± {fmt.format(m.half)}{unit}"


def and_list(items: list[str], sep: str = ", ") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else sep.join(items[:-1]) + " and " + items[-1]


def edge_note(edges, name) -> list:
    """The report's flag of tuned rates still at the last point followed past the grid's edge
    (rows of ``frames.edge_choices``; ``name(row)`` says which key): one paragraph, or none."""
    if edges.empty:
        return []
    return [Para(f"Rates chosen at the last point followed past the grid's edge ({EDGE_STEPS} "
                 f"grid steps at most; the best may lie further out): "
                 + ", ".join(f"{name(r)} ({r.lr:g})" for r in edges.itertuples()) + ".")]
