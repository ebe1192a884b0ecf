"""The answer cards that open the report: per question one plain sentence, the numbers that
carry it, one figure and what is open. Words ``compute.cards``; decides nothing (every fact a
sentence rests on is a field computed there)."""

from __future__ import annotations

import math

from qkvlab.report.blocks import Card as CardBlock
from qkvlab.report.blocks import Figure
from qkvlab.studies.qkv.compute.cards import Card, Number, cards
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.uptrain import VS_SCRATCH, VS_UNTIED
from qkvlab.studies.qkv.plan.placements import INIT_WORDS
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.vocab import label
from qkvlab.studies.qkv.render.text import and_list


def _num(x: float, unit: str) -> str:
    if unit == "×":
        return f"×{x:,.3g}" if x < 1000 else f"×{x:,.0f}"
    if unit == "% share":
        return f"{x:.1f}%"
    if unit in ("%", " pp"):
        return f"{x:+.1f}{unit.strip() if unit == '%' else unit}"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.1e}"
    return f"{x:.3g}"


def number_text(n: Number) -> str:
    """``+12.3% (95% CI +8.1% to +16.5%; worse; 64,000 parameters, 8 seeds)``."""
    ci = (f"95% CI {_num(n.lo, n.unit)} to {_num(n.hi, n.unit)}; "
          if n.lo is not None and n.hi is not None and math.isfinite(n.lo) else "")
    return f"{_num(n.value, n.unit)} ({ci}{n.kind}; {n.scale})"


def _what(n: Number) -> str:
    head, sep, rest = n.what.partition(" vs standard")
    return (label(head) + sep + rest) if sep else n.what


def sentence(c: Card) -> tuple[str, str]:
    """The card's plain sentence and, where something qualifies it, a second one (and where a
    design is no better than no attention at all, a third); by question, from its facts."""
    s, more = _sentence(c)
    none = c.facts.get("no_attention") or []
    if none:
        more += (" " + "; ".join(f"{label(d)} on {t}" for d, t in none) + ": indistinguishable "
                 "from no attention (its gap to standard is the attention-free control's, "
                 "summary).")
    return s, more


def _sentence(c: Card) -> tuple[str, str]:
    f, worse = c.facts, [n for n in c.numbers if n.kind == "worse"]
    decided = (f"{f['decided']} trained comparison{'s' if f['decided'] != 1 else ''} of this "
               "question decided" if f.get("decided") else "No trained comparison of this "
               "question is decided yet")
    if c.question == "q1":
        s = ("The 4th matrix adds parameters, not expressivity: folded into W_O it is standard "
             "attention with the same outputs." if f.get("fold_exact") else
             "Whether the 4th matrix adds anything rests on the trained comparisons.")
        more = []
        if f.get("saturates") is True:
            more.append("Without 1/√d_k inside the softmax, rows saturate at init "
                        "(unit-variance q and k)")
        better = f.get("trained_better") or []
        if better:
            where = ", ".join(f"{label(d)}" + (f" at d_head {h}" if h else "")
                              + (f" from {INIT_WORDS.get(i, i)}" if i else "")
                              for d, h, i in better)
            small = all(i == "gpt2" for _, _, i in better)
            more.append(f"yet in training {where} {'were' if len(better) > 1 else 'was'} "
                        "decided better than the scale inside; why is open"
                        + (" (from the model's small init that saturation may never arise)"
                           if small else ""))
        return s, (("; ".join(more) + ". ") if more else "") + decided + "."
    if c.question == "q2":
        s = ("One shared matrix is decided worse than three where a task needs to compare "
             f"different things ({', '.join(sorted({_what(n) for n in worse}))})."
             if worse else "Sharing one matrix is not decided worse at this profile.")
        more = (f"In {f['symmetric_models']} of {f['models']} pretrained attention stacks W_QK "
                "is more symmetric than random matrices: trained Q and K do resemble each "
                "other. " if f.get("models") else "")
        return s, more + decided + "."
    parts = []
    if "cache_ratio" in f:
        parts.append("K=V halves the KV cache" if f.get("cache_halved")
                     else f"K=V's KV cache is {_num(f['cache_ratio'], '×')} standard's")
    if "zero_shot" in f:
        parts.append(f"imposed on a trained model it multiplies perplexity by "
                     f"{_num(f['zero_shot'], '×')}")
    s = ("; ".join(parts) + ".") if parts else "K=V's cost rests on the trained comparisons."
    more = ""
    if "converted_gap" in f:
        g = f["converted_gap"]
        more = (f"After {f['converted_tokens']:,} tokens of uptraining the converted model is at "
                + (_num(1 + g, "×") if g >= 1 else f"{100 * g:+.1f}%")
                + " of its teacher's perplexity. ")
    hw = f.get("head_width") or {}
    for verdict, heads in sorted(hw.items()):
        more += (f"Against standard at other head widths K=V is decided {verdict} at d_head "
                 f"{and_list([str(h) for h in sorted(set(heads))])} (its own family). ")
    conv = f.get("converted") or {}
    said = [f"{v} {'to' if v == 'equivalent' else 'than'} {w}"
            for fam, w in ((VS_UNTIED, "the untied model trained on"),
                           (VS_SCRATCH, "K=V trained from scratch")) if (v := conv.get(fam))]
    if said:
        more += (f"Converting the study's trained standard lm to K=V (fitted start) and "
                 f"training +{100 * conv['fraction']:g}% more is decided "
                 f"{' and '.join(said)}. ")
    where = " in its headline family" if hw or said else ""
    return s[0].upper() + s[1:], more + decided + " from scratch" + where + "."


def open_text(c: Card) -> str:
    if not c.open:
        return ""
    s = (f"{c.open} of the {c.asked} comparisons this question asks are undecided, or not "
         "answerable here (attention not used at this budget, or the task not learned)")
    return s + (f"; make report PROFILE={c.settle} trains longer on more seeds."
                if c.settle else ".")


def card_blocks(data: StudyData, figs: dict[str, list[Figure]]) -> list[CardBlock]:
    by_name = {f.name: f for fs in figs.values() for f in fs}
    out = []
    for q, c in cards(data, set(by_name)).items():
        lead, more = sentence(c)
        out.append(CardBlock(q, QUESTIONS[q].title, lead,
                             tuple((_what(n), number_text(n)) for n in c.numbers),
                             by_name.get(c.figure), open_text(c), more))
    return out


def cards_json(data: StudyData, figs: dict[str, list[Figure]]) -> dict:
    """What ``answers.json`` holds: per question its title, sentence, numbers and what is open
    (``scripts/readme.py`` builds the README's answers table from it)."""
    return {b.id: {"question": b.question, "sentence": b.sentence, "more": b.more,
                   "numbers": [list(n) for n in b.numbers], "open": b.open,
                   "profile": data.profile.name}
            for b in card_blocks(data, figs)}
