"""Each question's answer card: the numbers that carry its answer, decided here, for
``render.cards`` to word. Two kinds of evidence count as decided:

- trained comparisons whose verdict survived Holm's correction and the control's gate
  (``answers``: worse, better or equivalent, with the 95% CI, unit and scale);
- deterministic measurements, which need no seeds: an exact fold (fp64 logits), bytes of a
  cache, weights of a pretrained model against a random null, a trained model's perplexity
  with a tie imposed or after converting it.

What stays open is counted (undecided after correction, attention not yet used, not learned),
with the profile that trains longer and on more seeds, where this one is smaller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qkvlab.studies.qkv.compute import headwidth, uptrain
from qkvlab.studies.qkv.compute.answers import DECIDED, Answer, answers
from qkvlab.studies.qkv.compute.convert import curve_ends, curves
from qkvlab.studies.qkv.compute.effects import effect
from qkvlab.studies.qkv.compute.findings import fold, scale_init, seed_summary
from qkvlab.studies.qkv.compute.frames import decode_ratios, records
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.share import shares
from qkvlab.studies.qkv.compute.ties import tie_costs
from qkvlab.studies.qkv.compute.zoo import zoo_table
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.uptrain import uptrain_steps

# the profile that decides what a smaller one leaves open (docs/study-profiles.md)
SETTLES = {"smoke": "standard", "quick": "standard"}
FIGURE = {"q1": "forest_q1", "q2": "q2_pretrained_symmetry", "q3": "q3_convert"}
FALLBACK_FIGURE = {"q2": "forest_q2", "q3": "forest_q3"}


@dataclass(frozen=True)
class Number:
    """One number of a card: ``what`` it measures, ``value`` with its 95% interval
    (``lo``/``hi``; None where it is exact or measured once), ``unit`` ("%", " pp", "×", ...),
    ``scale`` (what it was measured on) and ``kind``: a decided verdict ("worse", "better",
    "equivalent"), "exact" or "measured"."""

    what: str
    value: float
    unit: str
    scale: str
    kind: str
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class Card:
    """A question's card: its numbers (decided verdicts first), the facts the sentence rests on
    (``facts``: name -> value, each decided here), how many comparisons stay open of how many,
    the profile that would settle them ("" when none is larger) and the figure to show."""

    question: str
    numbers: tuple[Number, ...]
    facts: dict
    open: int
    asked: int
    settle: str
    figure: str


def _scale(a: Answer) -> str:
    s = a.scale
    parts = []
    if s.params:
        lo, hi = s.params
        parts.append(f"{lo:,} parameters" if lo == hi else f"{lo:,}–{hi:,} parameters")
    if s.seeds:
        parts.append(f"{max(s.seeds)} seed{'s' if max(s.seeds) > 1 else ''}")
    return ", ".join(parts) or f"profile {s.profile}"


def _decided(a: Answer) -> list[Number]:
    out = []
    for f in a.decided:
        e = f.effect
        what = f"{f.design} vs standard on {f.task}" + ("" if f.arm == "equal" else f", {f.arm}")
        if f.d_head is not None:
            what += f", d_head {f.d_head}" + (f", {f.init} init" if f.init else "")
        out.append(Number(what, e.value, e.unit, _scale(a), e.status.value, e.lo, e.hi))
    return out


def _q1(data: StudyData, a: Answer) -> tuple[list[Number], dict]:
    out, facts = [], {}
    fo = fold(data)
    if fo is not None:
        facts |= {"fold_exact": fo.exact, "fold_saved": fo.saved}
        out.append(Number("alt folded into standard (its 4th matrix into W_O): largest logit "
                          "difference, fp64", fo.d64, "", f"{len(fo.speeds)} trained alt models",
                          "exact" if fo.exact else "measured"))
    si = scale_init(records(data.probe))
    if si is not None and si.saturates is not None:
        facts["saturates"] = si.saturates
        for place in ("inside", "none"):
            m = seed_summary([100 * v for v in si.sat.get(place, [])])
            if m.n:
                half = m.half if math.isfinite(m.half) else None
                out.append(Number(f"rows saturated at init, 1/√d_k {place}", m.mean, "% share",
                                  f"d_k {si.dk}, {m.n} seed{'s' if m.n > 1 else ''}",
                                  "measured",
                                  None if half is None else m.mean - half,
                                  None if half is None else m.mean + half))
    # trained placements of the scale decided better than inside (standard), by head width
    # and init
    facts["trained_better"] = sorted({(f.design, f.d_head, f.init) for f in a.decided
                                      if f.design in ("outside", "both", "none")
                                      and f.effect.status.value == "better"}, key=str)
    return out, facts


def _q2(data: StudyData, a: Answer) -> tuple[list[Number], dict]:
    out, above = [], []
    z = zoo_table(data)
    if not z.empty:
        sym = z[z.measure == "symmetry"]
        for r in sym.to_dict("records"):
            if not math.isfinite(r.get("null_hi", math.nan)):
                continue
            above.append(bool(r["mean"] > r["null_hi"]))
            out.append(Number(f"W_QK symmetry, {r['title']} ({r['role']})", r["mean"], "",
                              f"random null {r['null_lo']:.3f}–{r['null_hi']:.3f}",
                              "measured"))
    facts = {"symmetric_models": sum(above), "models": len(above)} if above else {}
    return out, facts


def _q3(data: StudyData, a: Answer) -> tuple[list[Number], dict]:
    out, facts = [], {}
    dr = decode_ratios(data)
    if not dr.empty and (dr.design == "tied_kv").any():
        r = dr[dr.design == "tied_kv"].iloc[0]
        facts["cache_ratio"] = float(r.cache_vs_standard)
        facts["cache_halved"] = facts["cache_ratio"] == 0.5
        out.append(Number("KV cache of tied K=V, bytes per token vs standard",
                          float(r.cache_vs_standard), "×", "qkvlab's decoder, from the tensors",
                          "exact"))
    tc = tie_costs(data)
    if not tc.empty and {"tie", "stage", "layers"} <= set(tc):
        z = tc[(tc.tie == "kv") & (tc.stage == "zero-shot") & (tc.layers == "all")]
        for r in z.to_dict("records"):
            facts.setdefault("zero_shot", 1 + r["pct"] / 100)
            out.append(Number(f"{r['title']} with K=V imposed (fitted, no training): perplexity "
                              "over the untied model's", 1 + r["pct"] / 100, "×",
                              "held-out Bible text", "measured"))
    trained, more = _q3_trained(data)
    out += trained
    facts |= more
    ends = [e for e in curve_ends(curves(data)) if e.start == "fitted" and e.tie == "kv"]
    if ends:
        e = max(ends, key=lambda e: e.last[0])
        t, g, lo, hi = e.last
        facts |= {"converted_tokens": t, "converted_gap": g}
        out.append(Number(f"{e.model} converted to K=V (fitted start), after {t:,} tokens of "
                          "uptraining: perplexity over the teacher's", 1 + g, "×",
                          f"batch {e.batch}, Python source", "measured", 1 + lo, 1 + hi))
    return out, facts


def _q3_trained(data: StudyData) -> tuple[list[Number], dict]:
    """Q3's decided trained verdicts outside its headline family, each Holm-corrected in its
    own family and gated on its own control: K=V against standard in each head-width cell
    (``compute.headwidth``), and the controlled conversion's fitted start at its largest
    fraction against the untied model trained on and K=V from scratch (``compute.uptrain``).
    The profile's own head-width cell is the headline's comparison again and is left out.
    Facts: ``head_width`` (verdict -> the d_heads it was decided at) and ``converted``
    (baseline family -> verdict)."""
    out, facts, p = [], {}, data.profile
    for r in headwidth.comparisons(data).to_dict("records"):
        e = effect(r)
        own = r["d_model"] == p.d_model and r["n_heads"] == p.n_heads
        if r["design"] == "tied_kv" and e.status in DECIDED and not own:
            heads = f"{r['n_heads']:g} head{'s' if r['n_heads'] != 1 else ''}"
            out.append(Number(f"tied K=V vs standard on lm, {heads} × d_head {r['d_head']:g} "
                              "(head width)", e.value, e.unit,
                              f"d_model {r['d_model']:g}, {e.n} seeds", e.status.value,
                              e.lo, e.hi))
            facts.setdefault("head_width", {}).setdefault(e.status.value, []).append(
                int(r["d_head"]))
    up = uptrain.comparisons(data)
    if up.empty or not p.uptrain_fractions:
        return out, facts
    f = max(p.uptrain_fractions)
    for fam, against in ((uptrain.VS_UNTIED, "the untied model trained on the same way"),
                         (uptrain.VS_SCRATCH, "K=V trained from scratch for the same steps")):
        rows = up[(up.family == fam) & (up.fraction == f) & (up.design == "fitted")]
        for r in rows.to_dict("records"):
            e = effect(r)
            if e.status in DECIDED:
                out.append(Number(f"standard lm converted to K=V (fitted start), trained "
                                  f"+{100 * f:g}% ({uptrain_steps(p, f):,} steps) more, vs "
                                  f"{against}", e.value, e.unit, f"{e.n} seeds",
                                  e.status.value, e.lo, e.hi))
                facts.setdefault("converted", {"fraction": f})[fam] = e.status.value
    return out, facts


def no_attention(data: StudyData, question: str) -> list[tuple[str, str]]:
    """(design, task) of the question's rows whose share of attention's benefit reads
    indistinguishable from no attention (``compute.share``, ``plan.share``), in row order."""
    df = shares(data)
    hit = {(r.experiment, r.design, r.task) for r in df.itertuples()
           if r.reading == "none_kept"}
    return list(dict.fromkeys((r.design, t) for r in QUESTIONS[question].rows
                              for t in (*r.tasks, *r.also) if (r.experiment, r.design, t) in hit))


def cards(data: StudyData, figures: set[str] = frozenset()) -> dict[str, Card]:
    """One card per question. ``figures``: the names drawn, so each card shows one that
    exists."""
    out = {}
    for key, a in answers(data).items():
        extra, facts = {"q1": _q1, "q2": _q2, "q3": _q3}[key](data, a)
        facts = facts | {"no_attention": no_attention(data, key)}
        fig = FIGURE[key] if FIGURE[key] in figures else FALLBACK_FIGURE.get(key, "")
        out[key] = Card(key, tuple(_decided(a) + extra),
                        facts | {"decided": len(a.decided)},
                        open=len(a.open) + len(a.unused) + len(a.not_learned),
                        asked=a.family_m, settle=SETTLES.get(data.profile.name, ""),
                        figure=fig if fig in figures else "")
    return out
