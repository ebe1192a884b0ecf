"""The verdicts' longer sentences, one function each: why alt differs on translate, where the
scale must sit, tied Q=K on a directed relation, symmetry emerging in training, the width price
of K=V and how a gap moves with the budget. Each formats numbers read from ``compute``.
"""

from __future__ import annotations

import pandas as pd

from qkvlab.studies.qkv.compute.effects import Status, effect, finite
from qkvlab.studies.qkv.compute.findings import emergence, scale_init
from qkvlab.studies.qkv.compute.frames import (
    budget_gap,
    paired_row,
    pick,
    rows_of,
    task_effects,
    width_needed,
)
from qkvlab.studies.qkv.compute.results import StudyData, chance
from qkvlab.studies.qkv.plan.experiments import WIDTH_ACCURACY
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.vocab import TASK_METRIC, label, metric_of
from qkvlab.studies.qkv.render.text import ci_text, said

INCONCLUSIVE = "inconclusive at this scale"


def alt_init_sentence(data: StudyData) -> str:
    """Which explanation of alt's difference on translate the numbers support: its random W_h
    at init, or training with the extra matrix. alt_identity starts as standard's function
    with every other weight equal to the random-W_h alt's of the same seed, so alt − alt_identity
    (paired) isolates the init; the rates are each design's own where tuned."""
    own = TASK_METRIC["translate"]
    rand = effect(pick(rows_of(data, "alt_vs_standard"), design="alt", task="translate",
                       arm="equal", metric=own))
    ident = effect(pick(rows_of(data, "alt_init"), design="alt_identity", task="translate",
                        arm="equal", metric=own))
    init = effect(paired_row(data, ("alt_init", "alt_identity"), ("alt_vs_standard", "alt"),
                              "translate", own))
    if Status.MISSING in (rand.status, ident.status, init.status):
        return ""
    rates = ("each design at its own tuned learning rate" if data.profile.lr_grid else
             "one learning rate for all designs")
    s = (f"Why alt differs on translate ({rates}): with its random W_h alt is {said(rand)} "
         f"vs standard; with W_h = √d_k·I, so that it computes exactly standard's function at "
         f"step 0, {said(ident)} vs standard, and {said(init)} vs the random-W_h alt with "
         f"the same other weights.")
    if rand.status not in (Status.BETTER, Status.WORSE):
        return s + (" The random-W_h alt is not decided different from standard, so there is "
                    "no edge to explain at this scale.")
    # the init matters when starting alt as standard moves it towards standard's result
    moved = init.status is (Status.WORSE if rand.status is Status.BETTER else Status.BETTER)
    if moved and ident.status is Status.EQUIVALENT:
        return s + (" Started as standard, alt ends equivalent to it: the whole difference came "
                    "from the random W_h at init (with the outer 1/√d_k, alt's attention output "
                    "starts about √d_k times smaller), not from what alt can compute.")
    if moved:
        return s + (" Starting alt as standard removes a decided part of its difference: the "
                    "random W_h at init (with the outer 1/√d_k, alt's attention output starts "
                    "about √d_k times smaller) accounts for it, at least in part.")
    if init.status is Status.EQUIVALENT:
        return s + (" The two alts end alike, so the difference comes from training with the "
                    "extra matrix (its effect on the updates), not from where alt starts.")
    return s + (" The init comparison is undecided, so the numbers do not yet separate the two "
                "explanations.")


def scale_sentence(probe: list[dict]) -> str:
    f = scale_init(probe)
    if f is None:
        return ""
    parts = []
    for scale in ("inside", "outside", "both", "none"):
        if scale in f.sat:
            parts.append(f"{scale}: {ci_text([100 * v for v in f.sat[scale]], '{:.0f}', '%')} "
                         f"saturated rows, normalized entropy "
                         f"{ci_text(f.ent.get(scale, []), '{:.2f}')}, ‖∇W_Q‖ "
                         f"{ci_text(f.grad.get(scale, []), '{:.2g}')}")
    s = (f"Scale placement at init (unit-variance q, k; d_k = {f.dk}): " + "; ".join(parts)
         + ".")
    if f.saturates is True:
        s += " Without 1/√d_k inside the softmax the rows saturate"
        s += (" and the gradient reaching W_Q shrinks, as the question's commenters warned "
              "(\"the scale belongs inside the softmax, or gradients may vanish\")"
              if f.grad_shrinks else
              " (the gradient reaching W_Q at init is not smaller here, against the "
              "commenters' worry that without the inner scale gradients may vanish)")
        s += "; an outer factor does not prevent it." if f.outer_saturates else "."
    elif f.saturates is False:
        s += f" The saturation gap between 'none' and 'inside' is small: {INCONCLUSIVE}."
    return s


DIRECTED_KINDS = (("successor", "encoder"), ("successor_causal", "decoder"))


def directed_sentence(data: StudyData) -> str:
    """Q2's designs on a relation between contents (tied Q=K, with and without the self-mask,
    ...: ``questions.QUESTIONS["q2"]``'s rows), the encoder and the decoder version side by
    side, with standard's accuracy and chance."""
    rows = rows_of(data, "directed_relation")
    designs = QUESTIONS["q2"].designs("directed_relation")
    eff = {(d, t): task_effects(rows, d, t, data)[0] for d in designs for t, _ in DIRECTED_KINDS}
    if all(e.status is Status.MISSING for e in eff.values()):
        return ""
    base = []
    for task, kind in DIRECTED_KINDS:
        r = pick(rows, design="tied_qk", task=task, arm="equal", metric="accuracy")
        if r and finite(r.get("baseline_mean")):
            base.append(f"{kind} {100 * r['baseline_mean']:.1f}% (chance "
                        f"{100 * chance(task, data.profile):.1f}%)")
    s = ("A relation between contents (`successor`: each token's next token in the cyclic "
         "order of ids, which a symmetric score cannot rank for every token of a cycle; see "
         "`qkvlab.data.successor`)" + (f": standard reaches {' and '.join(base)}" if base else "")
         + "; " + "; ".join(f"{label(d)} in the {kind}: {said(eff[(d, t)])}"
                            for d in designs for t, kind in DIRECTED_KINDS
                            if eff[(d, t)].status is not Status.MISSING) + ".")
    enc = eff[("tied_qk", "successor")].status
    if enc in (Status.EQUIVALENT, Status.BETTER):
        s += (" Since no symmetric score orders a cycle, an encoder that keeps up with standard "
              "routes the direction around its heads: attention can fetch both neighbours and "
              "the readout, which sees the query token through the residual stream, pick the "
              "next one. One head need not hold one directed relation.")
    return s


def emergence_sentence(data: StudyData) -> str:
    e = emergence(data)
    if e is None:
        return ""
    s = (f"Trained from the same initial weights, qkvlab's encoder (mlm, {e.n_enc} steps) "
         f"reaches symmetry {ci_text(e.enc, '{:.3f}')} and its decoder (lm_char, {e.n_dec} "
         f"steps) {ci_text(e.dec, '{:.3f}')}")
    if e.status is not None:
        diff = f"difference {e.diff:+.3f} ± {e.half:.3f}"
        if e.status == "equivalent":
            s += f": equally symmetric ({diff}, 90% CI inside ±{e.margin:g})."
        elif e.status == "better":
            s += f": the encoder is more symmetric ({diff})."
        elif e.status == "worse":
            s += f": the decoder is more symmetric ({diff})."
        else:
            more = f"; ≈{e.seeds} seeds would decide it" if e.seeds else ""
            s += (f" ({diff}: undecided, the CI straddles zero and reaches past ±{e.margin:g}"
                  f"{more}).")
    else:
        s += f" ({INCONCLUSIVE}: too few seeds for a CI)."
    return s + unlearned(data, "symmetry_emergence", (("mlm", "encoder"),
                                                         ("lm_char", "decoder")))


def unlearned(data: StudyData, experiment: str, tasks) -> str:
    """A caveat naming each kind whose standard runs in ``experiment`` did not halve a
    context-free guess's perplexity (their weights' geometry then says little)."""
    runs = data.runs
    if runs.empty:
        return ""
    out = []
    for task, kind in tasks:
        m = metric_of(TASK_METRIC[task])  # chance is in the task's own metric
        if m.stored not in runs:
            continue
        v = runs[(runs.experiment == experiment) & (runs.task == task)][m.stored].dropna()
        ch = chance(task, data.profile)
        if len(v) and ch is not None and v.mean() > ch - m.halved:
            out.append(f"the {kind} ({task}) has not learned its task at this budget "
                       f"({'bits per character' if m.halved == 1 else 'val loss'} "
                       f"{v.mean():.3f}, context-free {ch:.3f}), so its symmetry "
                       f"says little")
    return (" Caveat: " + "; ".join(out) + ".") if out else ""


def width_sentence(data: StudyData) -> str:
    """The price of K=V in head width, read from ``width_needed`` (empty without runs)."""
    need = width_needed(data)
    if need.empty:
        return ""

    def w(m: int, design: str, arm: str) -> str:
        r = need[(need.m == m) & (need.design == design) & (need.arm == arm)]
        if r.empty:
            return ""
        r = r.iloc[0]
        return (f"> {r.widest}" if pd.isna(r.needed) else str(r.needed))

    parts, pattern = [], []
    for m in sorted(need.m.unique()):
        std, tied, mt = w(m, "standard", "equal"), w(m, "tied_kv", "equal"), \
            w(m, "tied_kv", "matched")
        s = f"m = {m}: standard {std}, tied K=V {tied}"
        if mt:
            s += f", tied K=V parameter-matched {mt}"
        parts.append(s)
        pattern.append((m, std, tied, mt))
    n = int(need.n.min())
    rows = data.compared("bind_vs_dhead", design="standard", arm="equal", metric="accuracy")
    std_best = float(rows.sort_values("d_head").groupby("m")["mean"].last().min())
    text = (f"The width price of K = V (`bind_codes`: m-bit keys bound to m-bit values, one "
            f"layer, one head; the d_head a design needs for a mean accuracy ≥ "
            f"{WIDTH_ACCURACY:.0%} (chance: 1/2^m) over {n} seeds, standard reaching "
            f"{std_best:.0%} at its widest; a parameter-matched head is given by the "
            f"standard width it matches): " + "; ".join(parts) + ".")
    exact = [(m, s, t) for m, s, t, _ in pattern if s.isdigit() and t.isdigit()]
    if exact:
        ratios = [int(t) / int(s) for _, s, t in exact]
        text += (f" Tied K=V needs {min(ratios):.2g}–{max(ratios):.2g}× standard's width"
                 if min(ratios) != max(ratios) else
                 f" Tied K=V needs {ratios[0]:.2g}× standard's width")
        text += (" (the prediction: d_head ≈ m for standard, ≈ 2m for K = V, whose one vector "
                 "per token must both be matched and carry the value).")
        if max(ratios) < 2:
            text += (" Less than 2m: in exact arithmetic one head of width m can do both (a "
                     "value part scaled small against the key part barely moves the score, and "
                     "the readout, which knows the queried key, reads the value from the "
                     "remainder), so below 2m the tie costs matching margin and learnability, "
                     "not rank: a little more width, or more training.")
        rec = [(m, s, mt) for m, s, _, mt in pattern if mt]
        same = [str(m) for m, s, mt in rec if mt == s]
        if rec:
            text += (" With standard's parameters (a 4/3 wider head) tied K=V "
                     + (f"recovers standard's width at m = {', '.join(same)}"
                        + ("" if len(same) == len(rec) else " only") if same else
                        "does not recover standard's width at any m") + ".")
    return text


def gap_trend(data: StudyData, task: str, design: str) -> str:
    """How a design's mean val-loss gap to standard moved between half and full budget (the
    ``budget`` frame, equal width): a gap that shrank by more than a quarter is still closing,
    so the full-budget effect overstates what the design costs a model trained to the end."""
    g = budget_gap(data, task, design)
    if g is None:
        return ""
    half, full = g["half"], g["full"]
    text = (f"Its mean val-loss gap to standard on {task} is {half:+.3f} at step {g['half_step']} "
            f"and {full:+.3f} at step {g['steps']}")
    if half > 0 and full < 0.75 * half:
        return text + (": still closing, so at this budget the perplexity cost above overstates "
                       "what the tie costs a model trained to the end.")
    return text + "."


def char_sentence(data: StudyData, experiments: tuple[str, ...], designs: tuple[str, ...]
                  ) -> str:
    """The character-level lm's row (lm_char, equal width) in bits per character: the second
    reading of a question's lm comparisons, never set beside a per-token published number."""
    rows = data.compared(experiments, task="lm_char", arm="equal").to_dict("records")
    parts = []
    for design in designs:
        e = task_effects(rows, design, "lm_char", data)[0]
        if e.status is not Status.MISSING:
            parts.append(f"{label(design)} {said(e)}")
    if not parts:
        return ""
    return ("By character (lm_char, the character-level lm, in bits per character at equal "
            "width; its margin is the per-token one per character): " + "; ".join(parts) + ".")
