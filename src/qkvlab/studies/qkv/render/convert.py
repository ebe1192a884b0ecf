"""Converted pretrained decoders in the report: the uptraining curves (figure), their numbers
(table) and the sentences of Q3 (K=V, GQA/MQA) and Q2 (Q=K, Q=K=V). Reads
``compute.convert``; decides nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from qkvlab.hf.convert import gap_text
from qkvlab.report.blocks import Block, Figure, Para, Table
from qkvlab.studies.qkv.compute.convert import (CurveEnd, StartFinding, curve_ends, curves,
                                                 start_findings)
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.zoo import manifest
from qkvlab.studies.qkv.plan.references import (KAYYAM_CONVERT, KAYYAM_CONVERT_CITE,
                                                KAYYAM_CONVERT_UNIT, KAYYAM_SCRATCH_KV_PCT)
from qkvlab.studies.qkv.render.figures_q import save
from qkvlab.studies.qkv.render.ties import ppl_text

START_LABELS = {"fitted": "fitted (qkvlab: V = K·M least squares, M folded into W_O)",
                "avg": "avg: (W_K + W_V)/2", "keep_k": "keep W_K", "keep_v": "keep W_V",
                "mean_pool": "kv heads mean-pooled", "none": "untied, uptrained the same way",
                "fitted_wo": "fitted, its W_O uptrained in the untied basis (M fixed; hf.basis)"}
SHORT = {"fitted": "fitted", "avg": "avg", "keep_k": "keep W_K", "keep_v": "keep W_V",
         "mean_pool": "mean-pooled", "none": "untied", "fitted_wo": "fitted (W_O untied basis)"}
TIES = {"kv": "K=V", "qk": "Q=K", "qkv": "Q=K=V", "mqa": "MQA", "none": "untied"}
ZERO_X = 2 ** 9  # where the zero-shot point is drawn on the log token axis (labelled "0")
Y_TICKS = (0.7, 0.8, 0.9, 1, 1.1, 1.5, 2, 3, 5, 10, 100, 1e3, 1e4, 1e5, 1e6)  # ratios
START_COLORS = {"fitted": "#d95f02", "avg": "#1b9e77", "keep_k": "#7570b3", "keep_v": "#e7298a",
                "mean_pool": "#66a61e", "none": "#777777", "fitted_wo": "#b2182b"}
# the other ties' curves, in colours none of K=V's starts uses
TIE_COLORS = {("qk", "fitted"): "#1f78b4", ("qkv", "fitted"): "#6a3d9a",
              ("mqa", "fitted"): "#a6761d", ("mqa", "mean_pool"): "#e6ab02"}


def _title(model: str) -> str:
    m = manifest()
    return m[model].title if model in m else model


pct = gap_text  # a gap in % (``+12.3%``), or a factor above +100% (``×20.7``)


def ci(g: float, lo: float, hi: float) -> str:
    if not math.isfinite(g):
        return "—"
    return f"{pct(g)} ({pct(lo)} to {pct(hi)})"


def tie_label(tie: str) -> str:
    return TIES.get(tie, tie.replace("gqa:", "GQA, kv heads "))


def fig_q3_convert(data: StudyData, out: Path) -> Figure | None:
    """Perplexity over the teacher's (log) against uptraining tokens (log), one line per tie,
    start and batch, 95% bootstrap bands; Kayyam et al.'s published conversion beside them
    (hollow). One panel per model for K=V, and where a model was converted to other ties too
    (Q=K, Q=K=V, GQA/MQA) a panel of those beside it, each with the untied baseline; where the
    K=V curves span more than ×1,000, another panel zooms on ×0.6–×3."""
    df = curves(data)
    if df.empty:
        return None
    models = list(dict.fromkeys(df.model))

    def zoomed(g):  # a layout choice: a second panel where tied points sit near the teacher
        tied = g[g.tie != "none"]
        return (1 + g.gap_hi).max() > 1e3 and ((1 + tied.gap) <= 3).any()
    panels = []
    for m in models:
        g = df[df.model == m]
        kv, others = g[g.tie.isin(("kv", "none"))], g[~g.tie.isin(("kv",))]
        panels += [(m, kv, False, "K=V")]
        if zoomed(kv):
            panels += [(m, kv, True, "K=V")]
        if (others.tie != "none").any():
            panels += [(m, others, False, "other ties")]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 5.6), squeeze=False)
    for ax, (model, g, zoom, what) in zip(axes[0], panels):
        _draw_convert(ax, g, model, zoom, what)
    fig.tight_layout()
    return save(fig, df.drop(columns=[c for c in ("nll_seq",) if c in df]), out, "q3_convert",
                "Converting a trained decoder to a tie: the gap to the teacher against "
                "uptraining tokens",
                "Each line: the tie imposed from one start, then uptrained by distillation from "
                "the untied model (KL at T = 2 plus next-token loss, AdamW, constant rate after "
                "warmup, so every budget is a prefix of one run) on Python's standard library "
                "source; held-out test files, per-token perplexity over the teacher's, 95% "
                "paired bootstrap over the evaluation sequences. Grey: the untied model uptrained "
                "the same way (the text's own effect). Hollow diamonds, " + KAYYAM_CONVERT_CITE
                + ": " + KAYYAM_CONVERT_UNIT + "; another model, text and tokenizer, so only "
                "their shape is comparable.")


def _draw_convert(ax, g, model: str, zoom: bool, what: str = "K=V") -> None:
    first = g.batch.min()
    several = g.batch.nunique() > 1  # e.g. a GPU curve at a larger batch beside the CPU's
    rates = sorted(set(g.lr), reverse=True) if "lr" in g else [None]
    precisions = g.precision.nunique() > 1 if "precision" in g else False
    for (tie, start, batch, lr, prec), c in g.assign(
            lr=g.lr if "lr" in g else None,
            precision=g.precision if "precision" in g else None).groupby(
            ["tie", "start", "batch", "lr", "precision"], sort=False, dropna=False):
        x = c.tokens.clip(lower=ZERO_X)
        name = ("untied, uptrained the same way" if tie == "none"
                else f"{tie_label(tie)}, {SHORT.get(start, start)} start")
        other = rates.index(lr) if lr in rates else 0  # a lower rate: another dash
        line, = ax.plot(x, 1 + c.gap, marker="^" if precisions and prec == "fp32"
                        else "o" if batch == first else "s", ms=4,
                        ls=("-" if batch == first else "--") if not other
                        else ("-.", ":")[(other - 1) % 2],
                        lw=1.0 if tie == "none" else 1.6,
                        color=START_COLORS.get(start) if tie in ("kv", "none")
                        else TIE_COLORS.get((tie, start)),
                        label=name + (f", batch {batch}" if several else "")
                        + (f", rate {lr:.2g}" if len(rates) > 1 else "")
                        + (f", {prec}" if precisions else ""))
        ax.fill_between(x, 1 + c.gap_lo, 1 + c.gap_hi, color=line.get_color(), alpha=0.15)
    if what == "K=V":  # the published conversion is of K=V
        for start, pts in KAYYAM_CONVERT.items():
            ax.plot([t for t, _ in pts], [1 + p / 100 for _, p in pts], marker="D", mfc="none",
                    ls=":", lw=1, color=START_COLORS[start],
                    label=f"published: K=V, {SHORT[start]} start")
        ax.axhline(1 + KAYYAM_SCRATCH_KV_PCT / 100, color="#444444", ls="--", lw=0.8,
                   label=f"published K=V trained from scratch (+{KAYYAM_SCRATCH_KV_PCT}%)")
    ax.axhline(1, color="#999999", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator([ZERO_X, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _: "0" if v <= ZERO_X else f"{v / 1e9:g}B" if v >= 1e9
        else f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k"))
    wide = (1 + g.gap_hi).max() > 1e3 and not zoom
    # where the curves span more than ×1,000: decades, every one labelled however far they reach
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=10) if wide else FixedLocator(Y_TICKS))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: f"{100 * (v - 1):+.0f}%" if v < 2 else f"×{v:,.0f}" if v < 1e7
        else f"×1e{math.log10(v):.0f}"))
    if zoom:
        ax.set_ylim(0.6, 3)
    ax.set_xlabel("uptraining tokens (0 = the tie as imposed)")
    ax.set_ylabel("perplexity over the teacher's, per token")
    ax.set_title(f"{_title(model)}: {what}, converted, then distilled from the untied model"
                 + (" (zoom)" if zoom else ""), fontsize=9)
    if not zoom:  # the zoom draws the same lines; below the axes, clear of the curves
        ax.legend(fontsize=6.5, frameon=False, loc="upper center", ncol=2,
                  bbox_to_anchor=(0.5, -0.16))


def _uptraining(r: dict) -> str:
    """``4 × 256, stdlib``: the batch and the training text (``+ more``: Python source read
    past the stdlib's train split, :func:`qkvlab.data.pysource.more_texts`)."""
    text = "stdlib + more" if "+more:" in str(r.get("corpus", "")) else "stdlib"
    return f"{int(r['batch'])} × {int(r.get('seq_len', 256))}, {text}" + _fp32(r.get("precision"))


def _fp32(precision) -> str:
    """``, fp32`` for a run that trained in fp32 (where the CPU has no native bf16), else ""
    (bf16 autocast, which every other run used, goes unsaid)."""
    return ", fp32" if precision == "fp32" else ""


def convert_blocks(data: StudyData) -> list[Block]:
    """The curves' numbers: one row per point."""
    df = curves(data)
    if df.empty:
        models = getattr(data.profile, "convert_models", ())
        return [Para("Converting a trained decoder and uptraining it: not measured in this store"
                     + (f" (this profile converts {', '.join(models)}; see the notes)" if models
                        else "; `qkvlab convert smollm2 --tie kv --start fitted` stores it")
                     + ".", note=True)]
    rows = tuple((_title(r["model"]), tie_label(r["tie"]), SHORT.get(r["start"], r["start"]),
                  _uptraining(r), f"{r['lr']:.2g}", f"{int(r['tokens']):,}", ppl_text(r["ppl"]),
                  ppl_text(r["ppl_teacher"]),
                  ci(r["gap"], r["gap_lo"], r["gap_hi"]),
                  ci(r["vs_untied"], r["vs_lo"], r["vs_hi"]), f"{r['kv_cache']:.2f}")
                 for r in df.to_dict("records"))
    return [Table("A trained decoder converted to each tie, then uptrained by distillation: "
                  "held-out per-token perplexity (Python standard library source, test files), "
                  "its gap to the teacher and to the untied model uptrained on the same tokens "
                  "the same way, 95% paired bootstrap CIs over the evaluation sequences",
                  ("model", "tie", "start", "batch, text", "rate", "tokens", "perplexity",
                   "teacher",
                   "over teacher",
                   "over untied uptrained", "KV cache ×"), rows)]


Q2_TIES = ("qk", "qkv")  # the ties each question's words on conversion cover (the rest: Q3)
# the papers' starts (Kayyam et al.'s for K=V, Ainslie et al.'s for GQA/MQA): a question's
# words read each model and tie's pair against one of these first
NAIVE = ("avg", "keep_k", "keep_v", "mean_pool")


def _reached(f: StartFinding) -> str:
    """When the better start of ``f`` reached the other's gap at their shared budget."""
    if f.began_below:
        return "began below it: no uptraining needed"
    if f.saved is not None:
        return f"after about {f.tokens_better:,.0f} tokens, {f.saved:.3g}× fewer"
    return "at the same budget" if f.tokens_better is not None else "—"


def start_blocks(data: StudyData, question: str | None = None) -> list[Block]:
    """Every pair of starts uptrained alike (``compute.convert.start_findings``) of
    ``question``'s ties (``in_question``), one row each: where each began, where each stood at
    the largest budget the two share, over the teacher and over the untied baseline, and when
    the better one reached the other's gap there."""
    df = curves(data)
    found = [f for f in start_findings(df) if in_question(f.tie, question)]
    if not found:
        return []
    rows = []
    for f in found:
        t = f.last[f.better][0]
        vs = [_over_untied(df, f, x, t) for x in (f.better, f.worse)]
        rows.append((_title(f.model), tie_label(f.tie), f"{f.batch}, {f.lr:.2g}"
                     + _fp32(f.precision),
                     f"{SHORT[f.better]} vs {SHORT[f.worse]}",
                     f"{pct(f.zero_shot[f.better])} vs {pct(f.zero_shot[f.worse])}", f"{t:,}",
                     ci(*f.last[f.better][1:]), ci(*f.last[f.worse][1:]),
                     " vs ".join(ci(*v) if v else "—" for v in vs),
                     "apart" if f.separated else "overlap", _reached(f)))
    return [Table("What a better start saves: every pair of starts of one tie uptrained alike "
                  "(the same batch, text and rate), the better one (lower at the largest "
                  "budget the two share) first; zero-shot and at that budget, per-token "
                  "perplexity over the teacher with 95% CIs, over the untied model uptrained "
                  "on the same tokens the same way, and when the better start reached the "
                  "other's gap there (read in nats between measured budgets, never "
                  "extrapolated)",
                  ("model", "tie", "batch, rate", "starts", "zero-shot", "tokens",
                   "better start", "other start", "over untied (better vs other)",
                   "intervals", "better reached the other's gap"), tuple(rows))]


def _headline_pairs(found: list[StartFinding]) -> list[StartFinding]:
    """One pair per model and tie for a question's words: against a paper's start
    (``NAIVE``) where one ran, at the largest budget such a pair shares, and at equal budgets
    the pair whose better start ended lowest (the first listed at equal gaps); the rest are
    ``start_blocks``' rows."""
    def rank(f: StartFinding) -> tuple:
        return f.worse in NAIVE, f.last[f.better][0], -f.last[f.better][1]
    best: dict[tuple, StartFinding] = {}
    for f in found:
        k = (f.model, f.tie)
        if k not in best or rank(f) > rank(best[k]):
            best[k] = f
    return list(best.values())


def in_question(tie: str, question: str | None) -> bool:
    """Whether a conversion to ``tie`` belongs to ``question``'s words: Q=K and Q=K=V to Q2,
    K=V and GQA/MQA to Q3, every tie where ``question`` is None."""
    return question is None or (tie in Q2_TIES) == (question == "q2")


def convert_sentence(data: StudyData, question: str | None = "q3") -> str:
    """A question's words on the conversion curves of its ties (``in_question``; None: every
    tie), per model and tie: one pair of starts (``_headline_pairs``: each start's first and
    last gap and what the better start saved, ``compute.convert.start_findings``), and the
    curve measured furthest against the untied baseline where that is further than the pair;
    every other pair and curve is in the tables (``start_blocks``, ``convert_blocks``)."""
    df = curves(data)
    every = [f for f in start_findings(df) if in_question(f.tie, question)]
    found = _headline_pairs(every)
    rates = df.groupby("model").lr.nunique() if "lr" in df else {}
    batches = df.groupby("model").batch.nunique() if "batch" in df else {}
    precs = df.groupby("model").precision.nunique() if "precision" in df else {}
    parts, told = [], set()
    for f in found:
        t = f.last[f.better][0]
        at = ([f"batch {f.batch}"] if batches.get(f.model, 1) > 1 else []) + (
            [f"rate {f.lr:.2g}"] if rates.get(f.model, 1) > 1 else [])
        trained = f", trained in {f.precision}" if precs.get(f.model, 1) > 1 else ""
        said = (f"{_title(f.model)} converted to {tie_label(f.tie)}"
                + (f" at {' and '.join(at)}" if at else "") + trained
                + f": from the {SHORT[f.better]} "
                f"start the perplexity begins at {pct(f.zero_shot[f.better])} over the teacher "
                f"against {pct(f.zero_shot[f.worse])} from {SHORT[f.worse]}; after {t:,} tokens "
                f"of uptraining {ci(*f.last[f.better][1:])} against "
                f"{ci(*f.last[f.worse][1:])}")
        said += (" (the intervals do not overlap)" if f.separated
                 else " (the intervals overlap: not separated at this budget)")
        vs = {x: _over_untied(df, f, x, t) for x in (f.better, f.worse)}
        if all(vs.values()):  # the tie's own cost, each curve's end said once (below)
            said += (f", and over the untied model uptrained on the same tokens the same way "
                     f"{ci(*vs[f.better])} against {ci(*vs[f.worse])}")
            told |= {(f.model, f.tie, (f.batch, f.lr, f.precision), x, t) for x in vs}
        if f.began_below:
            said += (f"; the {SHORT[f.better]} start began below the gap {SHORT[f.worse]} "
                     f"reached after {f.tokens_worse:,.0f} tokens: it needed no uptraining to "
                     "get there")
        elif f.saved is not None:
            said += (f"; the {SHORT[f.better]} start reached {SHORT[f.worse]}'s gap at "
                     f"{f.tokens_worse:,.0f} tokens after about {f.tokens_better:,.0f}, "
                     f"{f.saved:.3g}× fewer")
        parts.append(said)
    # a curve whose pair said its gap over the untied baseline at its last budget is not said
    # again; one read earlier, or without that baseline, says its end below
    # per model and tie, the curve read furthest against its baseline (at equal budgets the
    # lowest gap over it), where that is further than the pair said its baselines at (or it
    # said none)
    said_to = {k[:2]: k[4] for k in told}
    furthest: dict[tuple, CurveEnd] = {}
    for e in sorted((e for e in curve_ends(df) if e.paired is not None
                     and in_question(e.tie, question)),
                    key=lambda e: (e.paired[0], -e.paired[4])):
        furthest[(e.model, e.tie)] = e
    ends = [e for k, e in furthest.items()
            if (e.model, e.tie, (e.batch, e.lr, e.precision), e.start, e.last[0]) not in told
            and e.paired[0] > said_to.get(k, -1)]
    for e in ends:
        t, g, lo, hi, v, vlo, vhi = e.paired
        said = (f"{_title(e.model)} converted to {tie_label(e.tie)} from the {SHORT[e.start]} "
                f"start, uptrained at batch {e.batch}"
                + (f" and rate {e.lr:.2g}" if rates.get(e.model, 1) > 1 else "")
                + (f" in {e.precision}" if precs.get(e.model, 1) > 1 else "")
                + (" on the stdlib and more Python source" if e.more_text else "")
                + f": after {t:,} tokens {ci(g, lo, hi)} over the teacher and {ci(v, vlo, vhi)} "
                "over the untied model uptrained on the same tokens the same way")
        if e.last[0] > t:
            said += (f"; at its last budget, {e.last[0]:,} tokens, {ci(*e.last[1:])} over the "
                     "teacher, with no untied baseline measured there")
        parts.append(said)
    if not parts:
        return ""
    said = "Converting a trained model, then uptraining it: " + "; ".join(parts) + "."
    shown = {k[:4] for k in told} | {(e.model, e.tie, (e.batch, e.lr, e.precision), e.start)
                                     for e in ends}
    more = ""
    if len(every) > len(found) or any(
            (e.model, e.tie, (e.batch, e.lr, e.precision), e.start) not in shown
            for e in curve_ends(df) if in_question(e.tie, question)):
        more = (" Every other pair of starts and every curve's numbers are in the conversion "
                "tables.")
    if question == "q2":  # no published conversion to Q=K to set beside it
        return said + more
    tokens, gap = KAYYAM_CONVERT["avg"][-1]
    return (f"{said} Kayyam et al.'s averaged start is {gap:+.1f}% over its teacher after "
            f"{tokens / 1e6:g}M tokens on their 300M model (another model and text; the figure "
            f"draws both).{more}")


def convert_headline(data: StudyData) -> str:
    """How far each model's K=V conversion has been measured against its untied baseline: per
    model the curve paired with that baseline at the largest budget (at equal budgets, the
    lowest gap over it), in one sentence, Kayyam et al.'s last published point beside them;
    "" where no K=V curve has a baseline. The README's line under the answers
    (``scripts/convert-report.py --readme``)."""
    every = curve_ends(curves(data))
    kv = [e for e in every if e.tie == "kv" and e.paired is not None]
    best: dict[str, CurveEnd] = {}
    for e in sorted(kv, key=lambda e: (e.paired[0], -e.paired[4])):
        best[e.model] = e  # each model's last: its largest paired budget, then its lowest gap
    if not best:
        return ""
    parts = []
    precs = {m: {e.precision for e in every if e.model == m} for m in best}
    for e in sorted(best.values(), key=lambda e: -e.paired[0]):
        t, g, lo, hi, v, vlo, vhi = e.paired
        parts.append(f"{_title(e.model)} from the {SHORT.get(e.start, e.start)} start, after "
                     f"{t:,} tokens at batch {e.batch}"
                     + (f" in {e.precision}" if len(precs[e.model]) > 1 else "")
                     + (" on the stdlib and more Python source" if e.more_text else "")
                     + f": {ci(v, vlo, vhi)} over the untied model uptrained on the same tokens "
                     f"the same way, {ci(g, lo, hi)} over its teacher")
    tokens, gap = KAYYAM_CONVERT["avg"][-1]
    return ("**Converted to K=V, then uptrained by distillation** (per-token perplexity on "
            "held-out Python source, 95% CIs; [docs/convert.md](docs/convert.md)): "
            + "; ".join(parts) + f". Kayyam et al. report {gap:+.1f}% over their teacher after "
            f"{tokens / 1e6:g}M tokens (their 300M model from the averaged start, another text).")


def _over_untied(df: pd.DataFrame, f: StartFinding, start: str, tokens: int) -> tuple | None:
    """``start``'s gap over the untied baseline (value, lo, hi) at ``tokens`` in pair ``f``'s
    runs (its batch and rate), or None where no single such measurement exists."""
    m = df[(df.model == f.model) & (df.tie == f.tie) & (df.start == start)
           & (df.batch == f.batch) & (df.tokens == tokens) & df.vs_untied.notna()]
    if "lr" in m:
        m = m[m.lr == f.lr]
    if "precision" in m and f.precision:
        m = m[m.precision == f.precision]
    return tuple(m.iloc[0][["vs_untied", "vs_lo", "vs_hi"]]) if len(m) == 1 else None
