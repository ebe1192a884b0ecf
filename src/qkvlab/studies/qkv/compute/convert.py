"""Pretrained decoders converted to a tie and uptrained, as the study reads them: the stored
``convert`` records (``qkvlab.hf.convert``) as curves, each point's gap to the teacher and to the
untied model uptrained the same way, and what the curves decide about the starts.

Findings (render words them, it decides nothing):
- ``curves``: one row per (model, tie, start, tokens) with the gap to the teacher and its 95%
  bootstrap CI (from the record) and, where the untied model was uptrained on the same tokens the
  same way (tie "none", same uptraining, evaluation and text), the paired gap to it
  (``vs_untied``, CI ``vs_lo``/``vs_hi``): the tie's own cost with the text's effect removed.
  A fitted K=V start uptrained with W_O in the untied basis (``hf.basis``) is the start
  ``fitted_wo``: its own curve, compared with the others as a start is.
- ``start_findings``: per model and tie, each start's zero-shot and last gap, and the tokens
  the better start needed to reach the gap the other start ends at (log-linear between measured
  budgets, never extrapolated), so "tokens saved" is read off measured points only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qkvlab.hf.convert import VERSION, gap_ci
from qkvlab.studies.qkv.compute.results import StudyData

# what makes two runs of one model, tie and start one curve: the uptraining batch, text, rate
# and the precision it trained in (the record's: bf16 autocast where the CPU has native bf16,
# else fp32, so one command gives another experiment on another CPU)
ALIKE = ("batch", "corpus", "lr", "precision")
# what a curve's points must share with their untied baseline to be paired with it
SAME_RUN = ("model", "spec.eval_tokens", "spec.calib_tokens", "spec.corpus", "tokens",
            *(f"spec.uptrain.{k}" for k in ("lr", "batch", "seq_len", "warmup", "alpha",
                                            "temperature", "train", "chunk", "precision")))


def curves(data: StudyData) -> pd.DataFrame:
    """The stored curves (current version), with ``vs_untied`` where a baseline matches."""
    df = data.measure("convert")
    if df.empty or "spec.version" not in df:
        return pd.DataFrame()
    df = df[df["spec.version"] == VERSION].copy()
    if df.empty:
        return df
    if "spec.uptrain.o_basis" in df:  # W_O uptrained in the untied basis (hf.basis): its own
        df.loc[df["spec.uptrain.o_basis"] == "untied", "start"] = "fitted_wo"  # curve
    df["model"] = df["spec.model"]
    df["batch"] = df["spec.uptrain.batch"]
    df["corpus"] = df["spec.corpus"]
    df["seq_len"] = df["spec.uptrain.seq_len"]
    df["lr"] = df["spec.uptrain.lr"]
    # a budget measured in several runs (a 64k run and a 256k run that resumed it) is one point
    # (and the precision a run resolved to: the same command on another CPU is another run)
    keys = [c for c in (*SAME_RUN, "precision") if c in df]
    df = df.drop_duplicates(["tie", "start", *keys], keep="last")
    base = df[df.tie == "none"].set_index(keys)["nll_seq"]
    rows = []
    for _, r in df.iterrows():
        key = tuple(r[c] for c in keys)
        b = base.get(key) if r["tie"] != "none" else None
        if b is not None and len(b) == len(r["nll_seq"]):
            g, lo, hi = gap_ci(r["nll_seq"], b, int(r["spec.uptrain.seq_len"]) - 1)
        else:
            g = lo = hi = math.nan
        rows.append((g, lo, hi))
    df[["vs_untied", "vs_lo", "vs_hi"]] = pd.DataFrame(rows, index=df.index)
    cols = ["model", "tie", "start", "tokens", "steps", "ppl", "ppl_teacher", "gap", "gap_lo",
            "gap_hi", "vs_untied", "vs_lo", "vs_hi", "kv_cache", "attn_params", "lr",
            "eval_tokens", "tokens_per_s", "precision", "batch", "seq_len", "corpus"]
    return df[[c for c in cols if c in df]].sort_values(
        ["model", "tie", "start", "tokens"], kind="stable").reset_index(drop=True)


def tokens_to_reach(points: pd.DataFrame, target: float, per: float = 1.0) -> float | None:
    """Tokens at which a curve (``tokens``, ``gap``; measured budgets) first reaches ``target``;
    None where no measured budget reaches it (nothing is extrapolated), 0 where the curve
    starts at or below it. Between the two budgets around it the gap is read in nats,
    ln(1 + gap / per) (``per`` 1 for a ratio − 1, 100 for a % gap): the unit the losses are
    averaged in, so a ×389,503 start and a ×661 budget are not joined by a straight line in
    the ratio, which would put almost every gap on the way at the budget's end. Log-linear in
    tokens, and linear from the zero-shot point (no log of 0)."""
    p = points.sort_values("tokens")
    t, g = p.tokens.to_numpy(float), p.gap.to_numpy(float)
    hit = np.nonzero(g <= target)[0]
    if not len(hit):
        return None
    i = hit[0]
    if i == 0:
        return float(t[0])
    t0, t1 = t[i - 1], t[i]
    g0, g1, y = (math.log1p(v / per) for v in (g[i - 1], g[i], target))
    if t0 <= 0:
        return float(t0 + (t1 - t0) * (g0 - y) / (g0 - g1))
    lt = math.log(t0) + (math.log(t1) - math.log(t0)) * (g0 - y) / (g0 - g1)
    return float(math.exp(lt))


@dataclass(frozen=True)
class StartFinding:
    """Two starts of one tie on one model: which ends lower and what it saved."""
    model: str
    tie: str
    better: str
    worse: str
    zero_shot: dict          # start -> gap at 0 tokens
    last: dict               # start -> (tokens, gap, lo, hi) at the largest common budget
    separated: bool          # the two last CIs do not overlap
    target: float            # the worse start's gap at the largest common budget
    tokens_better: float | None   # tokens the better start needed to reach ``target``
    tokens_worse: float
    saved: float | None      # tokens_worse / tokens_better where the better start got there
                             # sooner after some uptraining (None when it began there: no ratio)
    began_below: bool        # the better start's zero-shot gap is already below ``target``
    batch: int = 0           # the uptraining batch both starts share
    lr: float = 0.0          # its rate
    precision: str = ""      # and the precision both trained in


def start_findings(df: pd.DataFrame) -> list[StartFinding]:
    """For each model and tie with two or more starts uptrained alike (the same batch, text and
    rate: a GPU curve at another batch, or a run at another rate, is another experiment): every
    pair of starts, the best one's pairs first (the lowest at the largest budget every start
    reached), each pair read at the largest budget the two share, so a start run to fewer tokens
    does not cut the others' comparison short. Every pair, not only the best against each: with
    the fitted start in two W_O bases, the folded fit against Kayyam's average is the question
    the untied basis would otherwise hide."""
    out = []
    if df.empty:
        return out
    alike = [c for c in ALIKE if c in df]
    for (model, tie, *rest), g in df[df.tie != "none"].groupby(["model", "tie", *alike],
                                                                sort=False):
        starts = list(dict.fromkeys(g.start))
        if len(starts) < 2:
            continue
        common = set.intersection(*(set(g[g.start == s].tokens) for s in starts))
        if not common:
            continue
        every = max(common)
        starts.sort(key=lambda s: g[(g.start == s) & (g.tokens == every)].gap.iloc[0])
        zero = {s: float(g[(g.start == s) & (g.tokens == 0)].gap.iloc[0])
                if (g[(g.start == s)].tokens == 0).any() else math.nan for s in starts}
        for one, other in itertools.combinations(starts, 2):
            top = max(set(g[g.start == one].tokens) & set(g[g.start == other].tokens))
            at = {x: g[(g.start == x) & (g.tokens == top)].iloc[0] for x in (one, other)}
            best, s = sorted((one, other), key=lambda x: at[x].gap)  # the better one there
            b, w = at[best], at[s]
            reach = tokens_to_reach(g[g.start == best], float(w.gap))
            out.append(StartFinding(
                model, tie, best, s, {best: zero[best], s: zero[s]},
                {x: (top, float(at[x].gap), float(at[x].gap_lo), float(at[x].gap_hi))
                 for x in (best, s)},
                separated=bool(b.gap_hi < w.gap_lo), target=float(w.gap),
                tokens_better=reach, tokens_worse=float(top),
                saved=top / reach if reach is not None and 0 < reach < top else None,
                began_below=reach == 0, batch=int(rest[0]) if rest else 0,
                lr=float(rest[2]) if len(rest) > 2 else 0.0,
                precision=str(rest[3]) if len(rest) > 3 else ""))
    return out


@dataclass(frozen=True)
class CurveEnd:
    """Where one curve (model, tie, start, batch, text, rate) stands: at the largest budget with
    an untied baseline beside it, and at its last budget if that is larger."""
    model: str
    tie: str
    start: str
    batch: int
    more_text: bool            # trained past the stdlib's train split (pysource.more_texts)
    paired: tuple | None       # (tokens, gap, lo, hi, vs_untied, vs_lo, vs_hi)
    last: tuple                # (tokens, gap, lo, hi)
    lr: float = 0.0            # the uptraining rate
    precision: str = ""        # and the precision it trained in


def curve_ends(df: pd.DataFrame) -> list[CurveEnd]:
    """One :class:`CurveEnd` per tied curve with uptraining (tokens > 0)."""
    out = []
    if df.empty:
        return out
    alike = [c for c in ALIKE if c in df]
    for (model, tie, start, *rest), g in df[df.tie != "none"].groupby(
            ["model", "tie", "start", *alike], sort=False):
        g = g.sort_values("tokens")
        if g.tokens.max() <= 0:
            continue
        with_base = g[g.vs_untied.notna() & (g.tokens > 0)]
        p = with_base.iloc[-1] if len(with_base) else None
        e = g.iloc[-1]
        out.append(CurveEnd(
            model, tie, start, int(g.batch.iloc[0]) if "batch" in g else 0,
            "+more:" in str(g.corpus.iloc[0]) if "corpus" in g else False,
            None if p is None else (int(p.tokens), *(float(p[c]) for c in
                                    ("gap", "gap_lo", "gap_hi", "vs_untied", "vs_lo", "vs_hi"))),
            (int(e.tokens), float(e.gap), float(e.gap_lo), float(e.gap_hi)),
            float(g.lr.iloc[0]) if "lr" in g else 0.0,
            str(g.precision.iloc[0]) if "precision" in g else ""))
    return out
