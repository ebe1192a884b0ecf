"""Verdict sentences generated from the measured numbers and their 95% confidence intervals.

Rules every sentence follows:
- an effect is written as mean ± CI half-width of the paired difference to ``standard`` in
  the unit people quote (% perplexity, percentage points), with its verdict against the
  metric's practical margin: worse, better, equivalent or undecided (``effects.effect``);
- a conclusion ("adds cost, not expressivity") is written only when the numbers support it.
Each ``verdict_qN(data)`` takes ``results.StudyData`` and returns a ``blocks.Verdict``: a
headline and the details, the longer ones from ``sentences.py``.
"""

from __future__ import annotations

from qkvlab.report.blocks import Verdict
from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.compute.findings import fold
from qkvlab.studies.qkv.compute.frames import (
    pick,
    records,
    rows_of,
    task_effects,
)
from qkvlab.studies.qkv.compute.payoff import kv_pays
from qkvlab.studies.qkv.compute.results import StudyData, chance
from qkvlab.studies.qkv.compute.zoo import zoo_table
from qkvlab.studies.qkv.plan.references import (
    KAYYAM_1B2_KV_PCT,
    KAYYAM_RERUN_KV_PCT,
    KAYYAM_RERUN_WHAT,
    REF_KV_CHARS_PER_TOKEN,
    REF_KV_CITE,
    REF_KV_PPL_PCT,
    SAPONATI_CITE,
    TRANSLATE_CHRF_AIM,
)
from qkvlab.studies.qkv.render.pretrained import (
    decoders_vs_published,
    large_heads,
    published_text,
)
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.vocab import DESIGNS, LM_CHARS_PER_TOKEN, label
from qkvlab.studies.qkv.render.sentences import (
    char_sentence,
    alt_init_sentence,
    directed_sentence,
    emergence_sentence,
    gap_trend,
    scale_sentence,
    width_sentence,
)
from qkvlab.studies.qkv.render.scale import scale_lead
from qkvlab.studies.qkv.render.share import share_sentence
from qkvlab.studies.qkv.render.text import ci_text, said
from qkvlab.studies.qkv.render.convert import convert_sentence
from qkvlab.studies.qkv.render.ties import tie_cost_sentence
from qkvlab.studies.qkv.render.headwidth import head_width_sentence
from qkvlab.studies.qkv.render.uptrain import uptrain_sentence



def standard_level(rows: list[dict], task: str, data: StudyData) -> str:
    """"<mean accuracy> on <task> (chance <c>)" of standard at equal width: what a verdict on
    an accuracy task is measured against (empty without runs)."""
    r = pick(rows, design="standard", task=task, arm="equal", metric="accuracy")
    ch = chance(task, data.profile)
    if r is None or ch is None:
        return ""
    return f"{100 * r['mean']:.1f}% on {task} (chance {100 * ch:.1f}%)"


# ---- Q1 --------------------------------------------------------------------------------------


def verdict_q1(data: StudyData) -> Verdict:
    rows = rows_of(data, "alt_vs_standard")
    eq, mt = task_effects(rows, "alt", "lm")
    teq, tmt = task_effects(rows, "alt", "translate")
    headline = (f"alt (4th matrix, outer 1/√d_k) vs standard: {said(eq)} on lm at equal width, "
                f"{said(mt)} parameter-matched; on translate {said(teq)} at equal width, "
                f"{said(tmt)} parameter-matched.")
    details = [c for c in (char_sentence(data, ("alt_vs_standard",), ("alt",)),) if c]
    fo = fold(data)
    if fo is not None:
        speed = ci_text(fo.speeds, "{:.2f}", "×")
        s = (f"Folding each trained alt head's W_hᵀ/√d_k into W_O reproduces its logits to "
             f"{fo.d64:.1e} in fp64 ({fo.d32:.1e} in fp32; logits reach {fo.scale:.1f}) with "
             f"{fo.saved:,} fewer parameters; the folded model runs at {speed} alt's speed")
        not_better = eq.status is not Status.BETTER and mt.status is not Status.BETTER
        cost = "parameters and time" if fo.faster else "parameters"
        if fo.exact and not_better:
            s += f": the 4th matrix adds {cost}, not expressivity."
        elif fo.exact:
            s += (": alt computes nothing standard cannot; any gain is in optimization, "
                  "not capacity.")
        else:
            s += "."
        details.append(s)
    details.append(alt_init_sentence(data))
    details.append(scale_lead(data))  # the loss verdicts; the probe beside them
    details.append(scale_sentence(records(data.probe)))
    convex = records(data.measure("convex_range"))
    conv = {d: [r["outside_share"] for r in convex if r["design"] == d]
            for d in ("standard", "alt")}
    ratio = {d: [r["range_ratio"] for r in convex if r["design"] == d]
             for d in ("standard", "alt")}
    if conv["standard"] and conv["alt"]:
        details.append(
            f"Convex combination: a standard head's output leaves its values' range in "
            f"{ci_text([100 * v for v in conv['standard']], '{:.2f}', '%')} of coordinates, an alt "
            f"head's in {ci_text([100 * v for v in conv['alt']], '{:.1f}', '%')} (output range / "
            f"value range: {ci_text(ratio['standard'], '{:.2f}')} vs "
            f"{ci_text(ratio['alt'], '{:.2f}')}).")
    return Verdict(headline, tuple(d for d in details if d))


# ---- Q2 --------------------------------------------------------------------------------------
MQAR_LEFT_OUT = (
    "mqar is not compared at this profile: standard attention does not leave its chance level "
    "(1/n_pairs) within the budget (seq 16–64, 4–8 pairs, lr 3e-4 to 1e-2, up to 2,500 steps, "
    "with and without noise tokens; Zoology trains it for 100 epochs of 10,000 examples, about "
    "31,000 steps at batch 32), so its comparisons could not count; relation is the recall "
    "task standard learns here.")


def verdict_q2(data: StudyData) -> Verdict:
    rows = rows_of(data, "tied_qk_qkv")
    head, parts = [], []
    designs = QUESTIONS["q2"].designs("tied_qk_qkv")
    for design in designs:  # the self-masked forms in the details
        masked = bool(DESIGNS[design].options.get("self_mask"))
        for task in ("lm", "mlm", "mqar", "relation"):
            eq, mt = task_effects(rows, design, task, data)
            if eq.status is not Status.MISSING:
                s = (f"{label(design)} on {task}: {said(eq)} at equal width, {said(mt)} "
                     f"parameter-matched")
                (head if task in ("lm", "relation") and not masked else parts).append(s)
    base = [standard_level(rows, t, data) for t in ("relation", "mqar")]
    base = [b for b in base if b]
    headline = ("; ".join(head) + "." if head else "No tied Q=K runs finished.") + \
        (" Standard reaches " + "; ".join(base) + "." if base and head else "")
    details = ["; ".join(parts) + "."] if parts else []
    char = char_sentence(data, ("tied_qk_qkv",), designs)
    if char:
        details.append(char)
    if "mqar" in data.profile.task_seeds and not data.profile.task_seeds["mqar"]:
        details.append(MQAR_LEFT_OUT)
    own = records(data.measure("own_position"))
    if own:
        def ow(design, task="lm"):
            return [r["own_weight"] for r in own if r["design"] == design and r["task"] == task]
        uni = [r["uniform"] for r in own if r["task"] == "lm"]
        details.append(
            f"Weight a head puts on its own position (lm, uniform spread would give "
            f"{ci_text(uni, '{:.2f}')}): "
            + ", ".join(f"{label(d)} {ci_text(ow(d), '{:.2f}')}"
                        for d in ("standard", *designs) if ow(d)) + ".")
    pre = []
    pt = data.measure("pretrained")
    if not pt.empty:
        summ = pt[(pt.level == "summary")]
        for (source, role), g in summ.groupby(["spec.source", "role"], sort=False):
            by = g.set_index("measure")
            if "symmetry" not in by.index:
                continue
            s = by.loc["symmetry"]
            # Saponati et al. publish the median over layers of the whole layer's W_QK (heads
            # summed): that one is set beside theirs; the mean over layers stays beside it.
            whole = "".join(
                f"whole layer, {what} over layers {by.loc[m, 'mean']:.2f} "
                f"(null {by.loc[m, 'null_mean']:+.3f}), "
                for m, what in (("symmetry_layer_median", "median"), ("symmetry_layer", "mean"))
                if m in by.index)
            pre.append(f"{source} {role}: {whole}per head {s['mean']:.2f} (random null "
                       f"{s['null_mean']:+.3f} ± {s['null_std']:.3f} sd)")
    if pre:
        zoo = zoo_table(data)
        pairs = zoo[zoo.published_model.map(lambda p: isinstance(p, str))]
        ref = "; ".join(f"{r['model']} {r['role']} {r['mean']:.3f} against {published_text(r)} "
                        f"({r['published_checkpoint']})" for r in pairs.to_dict("records"))
        details.append("Symmetry s of W_QK in pretrained models: " + "; ".join(pre) + "."
                       + (f" Beside the published medians over layers, one to one (reference "
                          f"values, not measured here; {SAPONATI_CITE}): {ref}." if ref else ""))
    details.append(directed_sentence(data))
    details.append(large_heads(data))
    details.append(decoders_vs_published(data))
    details.append(tie_cost_sentence(data, ("qk", "qkv")))
    details.append(convert_sentence(data, "q2"))
    details.append(emergence_sentence(data))
    return Verdict(headline, tuple(d for d in details if d))


# ---- Q3 --------------------------------------------------------------------------------------


def verdict_q3(data: StudyData) -> Verdict:
    lm = rows_of(data, "lm_tied_kv", "lm_gqa")
    eq, mt = task_effects(lm, "tied_kv", "lm")
    headline = (f"tied K=V: {said(eq)} on lm at equal width (published reference: "
                f"+{REF_KV_PPL_PCT}% per-token perplexity at 300M parameters, "
                f"+{KAYYAM_1B2_KV_PCT}% at 1.2B, EOS padding counted, {REF_KV_CITE}; "
                f"+{KAYYAM_RERUN_KV_PCT}% in their {KAYYAM_RERUN_WHAT}; ours is "
                f"per subword token too, of ~{LM_CHARS_PER_TOKEN:.1f} characters vs their "
                f"~{REF_KV_CHARS_PER_TOKEN:g}); "
                f"{said(mt)} parameter-matched.")
    details = [c for c in (char_sentence(data, ("lm_tied_kv",), ("tied_kv",)),) if c]
    trend = gap_trend(data, "lm", "tied_kv")
    if trend:
        details.append(trend)
    width = width_sentence(data)
    if width:
        details.append(width)
    tr = rows_of(data, "kv_translate")
    teq, tmt = task_effects(tr, "tied_kv_cross", "translate")
    chrf = effect(pick(tr, design="tied_kv_cross", arm="equal", metric="chrf"), what="chrF")
    if teq.status is not Status.MISSING:
        s = (f"Translation with tied K=V in cross-attention (the thread's 'for translation K "
             f"should be the same with V'): {said(teq)} at equal width, {said(tmt)} "
             f"parameter-matched; {said(chrf)}.")
        std = data.compared("kv_translate", design="standard", arm="equal", metric="chrf")
        if not std.empty:
            r = std.iloc[0]
            s += (f" Standard reaches chrF {r['mean']:.1f} ± {r['half']:.1f} on held-out verses "
                  f"(the aim is ≥ {TRANSLATE_CHRF_AIM}: "
                  + ("a cross-attention comparison at a level where translations carry meaning)."
                     if r["mean"] >= TRANSLATE_CHRF_AIM else
                     "below it a decode shares only fragments of its reference's character "
                     "n-grams, so this compares partly trained translators; a bigger model and "
                     "longer training, beyond this profile's CPU budget, are what it takes)."))
        details.append(s)
    dec = data.measure("decode_speed")
    if not dec.empty and {"standard", "tied_kv", "gqa_half"} <= set(dec.design):
        d = dec.set_index("design")
        cache = d.cache_bytes_per_token / d.cache_bytes_per_token["standard"]
        speed = d.decode_tokens_per_s / d.decode_tokens_per_s["standard"]
        g = pick(lm, design="gqa_half", task="lm", arm="equal", metric="val_loss")
        details.append(
            f"KV cache per token: tied K=V {cache['tied_kv']:.2f}× standard's, GQA (n_kv_heads = "
            f"n_heads/2) {cache['gqa_half']:.2f}×; batch-1 decode speed {speed['tied_kv']:.2f}× "
            f"and {speed['gqa_half']:.2f}× standard's. At that equal cache size GQA costs "
            f"{said(effect(g))} on lm, tied K=V {said(eq)}.")
    pays = kv_pays(data)
    if not pays.empty and {"standard", "tied_kv", "mqa"} <= set(pays.index):
        r = pays.loc["standard"]
        gqa = ", ".join(f"GQA with {d[4:]} kv heads {pays.loc[d, 'ratio']:.2f}×"
                        for d in pays.index if d.startswith("gqa_"))
        details.append(
            f"Where K=V pays: decoding {int(r.batch)} sequences at {int(r.context):,} tokens of "
            f"context, where the cache is {r.cache_share:.0%} of the bytes a step reads, tied "
            f"K=V decodes {pays.loc['tied_kv', 'ratio']:.2f}× standard's tokens/s ({gqa}, MQA "
            f"{pays.loc['mqa', 'ratio']:.2f}×); at short context and batch 1 the weights are the "
            f"cost and the layouts are level (figure: where K = V pays).")
    details.append(tie_cost_sentence(data, ("kv", "gqa")))
    details.append(convert_sentence(data))
    details.append(uptrain_sentence(data))
    details.append(head_width_sentence(data))
    return Verdict(headline, tuple(d for d in details if d))


VERDICTS = {"q1": verdict_q1, "q2": verdict_q2, "q3": verdict_q3}


def all_verdicts(data: StudyData) -> dict[str, Verdict]:
    """Each question's verdict, with where its designs are indistinguishable from no
    attention (``render.share``) after its details."""
    out = {}
    for q in QUESTIONS:
        v = VERDICTS[q](data)
        share = share_sentence(data, q)
        out[q] = Verdict(v.headline, (*v.details, share)) if share else v
    return out
