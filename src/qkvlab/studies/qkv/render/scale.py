"""Q1's scale in training on the page: the figure (each placement's loss vs inside against
d_head, one panel per init), the verdict table, and the words the Q1 answer opens with. Formats what
``compute.scale`` computed; the verdicts are the comparison rows' own.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from qkvlab.report.blocks import Figure, Table
from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.compute.results import StudyData, row_chance
from qkvlab.studies.qkv.compute.scale import (
    PLACED,
    ScaleAnswer,
    placement_effects,
    reported,
    scale_answers,
    trained_rates,
)
from qkvlab.studies.qkv.plan.placements import INIT_WORDS, PLACEMENTS, SCALE_INITS
from qkvlab.studies.qkv.plan.vocab import CONTROL, METRICS, color, label
from qkvlab.studies.qkv.render.answers import amount
from qkvlab.studies.qkv.render.figures_q import save
from qkvlab.studies.qkv.render.text import LEGEND, WORDS, cell, num, pm

DECIDED = (Status.WORSE, Status.BETTER, Status.EQUIVALENT)
NO_VERDICT = (Status.ATTENTION_UNUSED.value, Status.NOT_LEARNED.value)


def fig_q1_scale_train(data: StudyData, out: Path) -> Figure | None:
    """Each placement's paired difference to inside on lm against d_head, 95% CI bars, one
    panel per init."""
    df = placement_effects(data)
    df = df[df.value.notna()]
    if df.empty:
        return None
    m = METRICS[reported()]
    widths = sorted(df.d_head.unique())
    inits = [i for i in SCALE_INITS if i in set(df.init)]
    fig, axes = plt.subplots(1, len(inits), figsize=(4.2 * len(inits) + 1.0, 4.0),
                             sharey=True, squeeze=False)
    for ax, init in zip(axes[0], inits):
        sub = df[df.init == init]
        for i, tag in enumerate(t for t in PLACED if t in set(sub.design)):
            g = sub[sub.design == tag].sort_values("d_head")
            x = g.d_head * 2 ** (0.06 * (i - (len(PLACED) - 1) / 2))  # side by side, log axis
            yerr = [(g.value - g.lo).fillna(0), (g.hi - g.value).fillna(0)]
            ax.errorbar(x, g.value, yerr=yerr, fmt="-", color=color(tag), capsize=3, lw=1.4,
                        label=label(tag))
            for xi, r in zip(x, g.itertuples()):  # filled: a verdict; open: none (grey edge)
                verdict = r.status not in NO_VERDICT and r.status != Status.UNDECIDED.value
                ax.plot(xi, r.value, "o", ms=7, color=color(tag),
                        mfc=color(tag) if verdict else "white",
                        mec="#888888" if r.status in NO_VERDICT else color(tag), mew=1.5)
        ax.axhspan(m.show(-m.raw_margin), m.show(m.raw_margin), color="#dddddd", lw=0,
                   zorder=0)
        ax.axhline(0, color=color("inside"), lw=1.2, label="1/√d_k inside (standard)")
        ax.set_xscale("log", base=2)
        heads = {int(w): data.profile.d_model // int(w) for w in widths}
        ax.set_xticks(widths, [f"{w}\n({h} head{'s' if h > 1 else ''})"
                               for w, h in heads.items()])
        ax.minorticks_off()
        ax.set_xlabel("d_head (head width d_k)")
        ax.set_title(f"from {INIT_WORDS.get(init, init)}", fontsize=9)
    axes[0][0].set_ylabel(f"{m.what} vs inside ({m.unit.strip()})\n< 0 better · > 0 worse")
    axes[0][-1].legend(frameon=False, fontsize=8, loc="best")
    return save(fig, df, out, "q1_scale_train", "Q1: where 1/√d_k sits, trained on lm",
                f"Each placement's paired {m.what} difference to 1/√d_k inside (standard) from "
                f"the same init on lm, same seeds, ± 95% CI, against the head width (heads × "
                f"d_head = d_model {data.profile.d_model}); left: the model's own init (std "
                f"0.02), right: unit variance (std 1/√d_model), where a raw score's variance "
                f"grows with d_k. Each (placement, d_head, init) trained at its own rate where "
                f"the profile tunes rates. Grey band: the practical margin ({m.margin_text}). "
                f"Filled marker: a verdict after Holm over Q1's family; open: undecided; grey "
                f"edge: no verdict (attention not used at this budget, or not learned). Points "
                f"are drawn side by side.")


def _rate(rates: pd.DataFrame, design: str, d_head: int, init: str, tuned: bool) -> str:
    r = rates[(rates.design == design) & (rates.d_head == d_head) & (rates.init == init)]
    if r.empty:
        return "—"
    lr = f"{r.lr.iloc[0]:g}"
    if not tuned:
        return f"{lr} (lm's)"
    return lr + (" (grid edge: widen it)" if r.edge.iloc[0] else "")


def scale_table(data: StudyData) -> list[Table]:
    """The verdict table: per init and d_head, inside, every placement and the control: rate,
    seeds, lm's metric (mean ± 95% CI) and the verdict vs inside from the same init."""
    metric = reported()
    df = data.compared("scale_train", metric=metric)
    if df.empty:
        return []
    order = {t: i for i, t in enumerate((*PLACEMENTS, CONTROL))}
    inits = {t: i for i, t in enumerate(SCALE_INITS)}
    df = df.assign(_o=df.design.map(order), _i=df.init.map(inits)).sort_values(
        ["_i", "d_head", "_o"])
    rates, tuned = trained_rates(data), bool(data.profile.lr_grid)
    body = []
    for r in df.to_dict("records"):
        d = int(r["d_head"])
        name = "1/√d_k inside (standard)" if r["design"] == "standard" else label(r["design"])
        verdict = "baseline" if r["design"] == "standard" else \
            cell(effect(r, chance=row_chance(r, data.profile)))
        init = "— (no Q, K)" if r["design"] == CONTROL else r["init"]
        body.append((init, f"{d} × {data.profile.d_model // d}", name,
                     _rate(rates, r["design"], d, r["init"], tuned), str(r["n"]),
                     pm(r["mean"], r["half"], 4), verdict))
    return [Table("Where 1/√d_k sits, trained: lm's test loss per placement, head width and init "
                  "vs inside from the same init; verdicts after Holm over Q1's family, gated at "
                  "each width by the control against inside from the model's own init",
                  ("init", "d_head × heads", "placement", "learning rate", "seeds",
                   "test loss, nats per subword token (mean ± 95% CI)", "vs inside"),
                  tuple(body),
                  legend=LEGEND)]


def _by_status(found) -> str:
    """"worse at d_head 256 (+4.0 ± 1.2% perplexity); equivalent at d_head 16 and 64"."""
    groups: dict[Status, list[tuple[int, object]]] = {}
    for d, e in found:
        groups.setdefault(e.status, []).append((d, e))
    parts = []
    for status, items in groups.items():
        ds = [f"{d} ({amount(e)})" if status in DECIDED else str(d) for d, e in items]
        where = ds[0] if len(ds) == 1 else ", ".join(ds[:-1]) + " and " + ds[-1]
        parts.append(f"{WORDS[status]} at d_head {where}")
    return "; ".join(parts)


def conclusion(a: ScaleAnswer) -> str:
    """What the verdicts at the widest d_head say about "1/√d_k must go inside"."""
    none, w = a.status("none"), a.widest("none")
    if none is None:
        return ""
    dk = w[0]
    statuses = {e.status for found in a.effects.values() for _, e in found}
    if statuses == {Status.ATTENTION_UNUSED}:
        return ("No verdict yet: standard does not beat the attention-free control at this "
                "budget, so where the scale sits cannot matter to the loss.")
    if statuses <= {Status.ATTENTION_UNUSED, Status.NOT_LEARNED}:
        return ("No verdict yet: lm is not learned, or attention not used, at this budget, so "
                "where the scale sits cannot show in the loss.")
    if none is Status.WORSE:
        s = f"So the constant is needed at d_head {dk}: without it lm trains worse"
        out = a.status("outside")
        if out is Status.WORSE:
            s += "; dividing the head output instead does not replace it"
        elif out is Status.EQUIVALENT:
            s += "; dividing the head output instead does as well"
        t5 = a.status("none_t5")
        if t5 in (Status.EQUIVALENT, Status.BETTER):
            s += ("; folded into W_Q's initialization (T5) it does as well, so what matters is "
                  "the scores' size at the start, not a divisor inside the softmax")
        elif t5 is Status.WORSE:
            s += "; folding it into W_Q's initialization (T5) does not recover it"
        return s + "."
    if none is Status.EQUIVALENT:
        return (f"So at this scale the constant need not sit inside: without it lm trains as "
                f"well at d_head {dk} from this init.")
    if none is Status.BETTER:
        return f"At this scale lm trains better without the constant at d_head {dk}."
    return f"Whether it must sit inside is open at d_head {dk} at this scale."


def unused_words(a: ScaleAnswer) -> str:
    """Why no placement is judged at a width where standard does not beat the control, from the
    mean losses."""
    m, out = a.means, ""
    for d in a.unused_widths():
        inside, ctrl = m.get(("standard", d)), m.get(("control", d))
        if inside is None or ctrl is None:
            continue
        out += (f" At d_head {d} inside does not beat the attention-free control "
                f"({num(inside, 4)} vs {num(ctrl, 4)} nats), so no placement is judged there.")
    return out


def scale_words(a: ScaleAnswer) -> str:
    """The trained answer on where 1/√d_k sits from one init: each placement's verdicts by
    width, what they say, why a width has none, and the rates chosen at the grid's edge."""
    if not a.effects:
        return ""
    unused = all(e.status is Status.ATTENTION_UNUSED for found in a.effects.values()
                 for _, e in found)
    s = f"From {INIT_WORDS.get(a.init, a.init)}"
    s += (": " + conclusion(a) if unused else  # every cell reads the same: said once
          ", vs inside: " + "; ".join(f"{label(t)}: {_by_status(found)}"
                                      for t, found in a.effects.items()) + ". " + conclusion(a))
    s += unused_words(a)
    if a.edges:
        s += (" Rates chosen at the grid's edge even after one more point past it (the best "
              "may lie beyond): "
              + ", ".join(f"{label(t)} at d_head {d}" for t, d in a.edges) + ".")
    return s


def scale_lead(data: StudyData) -> str:
    """The words Q1's answer opens with: the trained placements from each init
    (``scale_words``), then the probe beside them as the mechanism."""
    answers = [a for a in scale_answers(data) if a.effects]
    if not answers:
        return ""
    a = answers[0]
    rate = ("each placement at its own learning rate, tuned per d_head and init" if a.tuned
            else "every placement at lm's learning rate, since this profile tunes no rates (a "
                 "placement that needs another rate is judged at lm's)")
    s = (f"Where 1/√d_k sits, trained on lm with each width split as heads × d_head = d_model "
         f"({a.d_model}), {rate}. " + " ".join(scale_words(x) for x in answers))
    decided = any(e.status in DECIDED for x in answers for found in x.effects.values()
                  for _, e in found)
    if decided and not a.tuned:
        s += (" Every cell here trains at one rate: a placement whose best rate moves with "
              "d_head or the init may read otherwise at its own rate, which the standard "
              "profile tunes per cell.")
    if a.probe_dk is not None and a.saturated_inside is not None \
            and a.saturated_none is not None:
        s += (f" Mechanism (the scale probe, at init from unit variance): at d_k {a.probe_dk}, "
              f"{num(100 * a.saturated_none, 2)}% of attention rows saturate without 1/√d_k, "
              f"{num(100 * a.saturated_inside, 2)}% with it inside.")
    return s
