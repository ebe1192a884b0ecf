"""The share of attention's benefit in words: the table beside the summary and one sentence per
question where a design is indistinguishable from no attention. The shares and their readings
are ``compute.share``'s; this module words them."""

from __future__ import annotations

import math

import pandas as pd

from qkvlab.report.blocks import Table
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.share import shares
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.vocab import label

READ_WORDS = {"none_kept": "indistinguishable from no attention",
              "part": "keeps part of it",
              "all_kept": "indistinguishable from standard",
              "below_control": "worse than no attention",
              "above_standard": "better than standard",
              "undecided": "undecided"}
CAPTION = ("What each design gives up of what attention buys, where standard beats the "
           "attention-free control: per seed, (design − standard) / (control − standard) on the "
           "task's own metric at equal width (for a loss, ln(1 + gap) / ln(1 + the control's "
           "gap)), mean over seeds with its 95% CI; 0% is standard, 100% no attention at all. "
           "Read before the runs: indistinguishable from no attention where the CI holds 100% "
           "and not 0%, from standard where it holds 0% and not 100%, part where it lies "
           "between, undecided where it holds both. Uncorrected (5% each).")


def _pct(x) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _gap(value, half, unit: str, digits) -> str:
    """A gap as the tables show an effect: value ± half, each with its unit."""
    if value is None or not math.isfinite(value):
        return "—"
    n = int(digits)
    h = f" ± {half:.{n}f}{unit}" if half is not None and math.isfinite(half) else ""
    return f"{value:+.{n}f}{unit}{h}"


def _where(r) -> str:
    tags = [f"{k} {int(getattr(r, k))}" for k in ("m", "d_head", "d_model")
            if getattr(r, k) is not None and not pd.isna(getattr(r, k))]
    return r.task + (f" ({', '.join(tags)})" if tags else "")


def share_table(data: StudyData) -> Table:
    df = shares(data)
    used = df[df.attention_used == 1].drop_duplicates(["design", "task", "m", "d_head",
                                                        "d_model"])
    rows = tuple((_where(r), label(r.design), _gap(r.value, r.half, r.unit, r.digits),
                  _gap(r.control_value, r.control_half, r.unit, r.digits),
                  f"{_pct(r.share)} ({_pct(r.lo)} to {_pct(r.hi)})", READ_WORDS[r.reading],
                  str(r.n)) for r in used.itertuples())
    unused = int((df.attention_used == 0).sum())
    note = (f" {unused} comparison(s) where standard does not beat the control have no share."
            if unused else "")
    return Table(CAPTION + note, ("task", "design", "design's gap", "control's gap",
                                  "share given up (95% CI)", "reading", "seeds"), rows,
                 empty="standard beats the control in no comparison at this profile")


def share_sentence(data: StudyData, question: str) -> str:
    """Where a design of ``question``'s rows is indistinguishable from no attention."""
    df = shares(data)
    rows = {(r.experiment, r.design) for r in QUESTIONS[question].rows}
    mine = pd.Series([(e, d) in rows for e, d in zip(df.experiment, df.design)], index=df.index,
                     dtype=bool)
    hit = df[(df.reading == "none_kept") & mine]
    if hit.empty:
        return ""
    parts = [f"{label(r.design)} on {_where(r)} ({_pct(r.share)} of the control's gap, "
             f"95% CI {_pct(r.lo)} to {_pct(r.hi)})" for r in hit.itertuples()]
    return ("Indistinguishable from no attention at all (its gap to standard is the "
            "attention-free control's): " + "; ".join(parts) + ".")
