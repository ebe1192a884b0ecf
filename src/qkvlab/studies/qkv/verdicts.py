"""Verdict sentences generated from the measured numbers and their 95% confidence intervals.

Rules every sentence follows:
- an effect is written as mean ± CI half-width of the paired difference to ``standard`` in
  the unit people quote (% perplexity, percentage points), with its verdict against the
  metric's practical margin: worse, better, equivalent or undecided (``effects.effect``);
- a conclusion ("adds cost, not expressivity") is written only when the numbers support it.
Each ``verdict_qN(data)`` takes ``results.StudyData`` and returns a ``blocks.Verdict``;
``WORDS`` are the short verdict words of the summary table (``LEGEND`` explains them once).
"""

from __future__ import annotations

import pandas as pd

from qkvlab.stats import decide, mean_ci, paired
from qkvlab.report.blocks import Verdict
from qkvlab.studies.qkv.effects import LEGEND, LN2, WORDS, effect, finite  # noqa: F401 (re-exported)
from qkvlab.studies.qkv.experiments import MARGINS, WIDTH_ACCURACY
from qkvlab.studies.qkv.results import StudyData, chance
from qkvlab.studies.qkv.tie_view import tie_cost_sentence
from qkvlab.studies.qkv.zoo_view import decoders_vs_published, large_heads

INCONCLUSIVE = "inconclusive at this scale"
# Published reference (not measured here): tied K=V costs about +3.1% perplexity at
# 300M-1.2B parameters (Kayyam et al., ICML 2026, arXiv 2606.04032; ../shared/REFERENCES.md).
REF_KV_PPL_PCT = 3.1
REF_KV_CITE = "Kayyam et al. 2026, arXiv 2606.04032"
TRANSLATE_CHRF_AIM = 30  # chrF at which a translation comparison means something (issue #15)


def pick(rows: list[dict], **tags) -> dict | None:
    """The first row whose fields equal ``tags``."""
    for r in rows:
        if all(r.get(k) == v for k, v in tags.items()):
            return r
    return None


def ci_text(values: list[float], fmt: str = "{:.3g}", unit: str = "") -> str:
    """``mean ± half`` over seeds (``mean`` alone, with the seed count, if only one)."""
    m = mean_ci(values)
    if not m["n"]:
        return "n/a"
    if not finite(m["half"]):
        return f"{fmt.format(m['mean'])}{unit} (1 seed)"
    return f"{fmt.format(m['mean'])}{unit} ± {fmt.format(m['half'])}{unit}"


def rows_of(data: StudyData, *experiments: str) -> list[dict]:
    """Comparison rows of some experiments as dicts (what the sentences read)."""
    return data.compared(experiments).to_dict("records")


def standard_level(rows: list[dict], task: str, data: StudyData) -> str:
    """"<mean accuracy> on <task> (chance <c>)" of standard at equal width: what a verdict on
    an accuracy task is measured against (empty without runs)."""
    r = pick(rows, design="standard", task=task, arm="equal", metric="accuracy")
    ch = chance(task, data.profile)
    if r is None or ch is None:
        return ""
    return f"{100 * r['mean']:.1f}% on {task} (chance {100 * ch:.1f}%)"


def _task_effects(rows: list[dict], design: str, task: str, lower: bool,
                  data: StudyData | None = None) -> tuple[dict, dict]:
    metric = "accuracy" if not lower else "val_loss"
    ch = None if data is None else chance(task, data.profile)
    eq = effect(pick(rows, design=design, task=task, arm="equal", metric=metric), lower, chance=ch)
    mt = effect(pick(rows, design=design, task=task, arm="matched", metric=metric), lower, chance=ch)
    return eq, mt


# ---- Q1 --------------------------------------------------------------------------------------
def probe_at(probe: list[dict], stat: str, step: int | None = None) -> dict[tuple, list[float]]:
    """``{(scale, d_head): [values over seeds]}`` of a probe statistic at ``step`` (first if None)."""
    out: dict[tuple, list[float]] = {}
    first = {}
    for r in probe:
        if r["stat"] == stat:
            key = (r["scale"], r["d_head"], r["seed"])
            first[key] = min(first.get(key, r["step"]), r["step"])
    for r in probe:
        if r["stat"] != stat:
            continue
        want = first[(r["scale"], r["d_head"], r["seed"])] if step is None else step
        if r["step"] == want:
            out.setdefault((r["scale"], r["d_head"]), []).append(r["value"])
    return out


def records(df) -> list[dict]:
    return [] if df is None or df.empty else df.to_dict("records")


def verdict_q1(data: StudyData) -> Verdict:
    rows = rows_of(data, "alt_vs_standard")
    eq, mt = _task_effects(rows, "alt", "lm", True)
    teq, tmt = _task_effects(rows, "alt", "translate", True)
    headline = (f"alt (4th matrix, outer 1/√d_k) vs standard: {eq['text']} on lm at equal width, "
                f"{mt['text']} parameter-matched; on translate {teq['text']} at equal width, "
                f"{tmt['text']} parameter-matched.")
    details = []
    fold = records(data.measure("fold_alt"))
    if fold:
        d64 = max(f["max_abs_diff_fp64"] for f in fold)
        d32 = max(f["max_abs_diff_fp32"] for f in fold)
        scale = max(f["max_abs_logit"] for f in fold)
        saved = fold[0]["params_alt"] - fold[0]["params_folded"]
        speed = ci_text([f["speed_folded_vs_alt"] for f in fold], "{:.2f}", "×")
        s = (f"Folding each trained alt head's W_hᵀ/√d_k into W_O reproduces its logits to "
             f"{d64:.1e} in fp64 ({d32:.1e} in fp32; logits reach {scale:.1f}) with {int(saved):,} "
             f"fewer parameters; the folded model runs at {speed} alt's speed")
        exact = d64 <= 1e-9 * max(scale, 1.0)
        not_better = eq["status"] != "better" and mt["status"] != "better"
        faster = mean_ci([f["speed_folded_vs_alt"] for f in fold])["mean"] > 1.0
        cost = "parameters and time" if faster else "parameters"
        if exact and not_better:
            s += f": the 4th matrix adds {cost}, not expressivity."
        elif exact:
            s += ": alt computes nothing standard cannot; any gain is in optimization, not capacity."
        else:
            s += "."
        details.append(s)
    details.append(alt_init_sentence(data))
    details.append(_scale_sentence(records(data.probe)))
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


def _paired_row(data: StudyData, a: tuple[str, str], b: tuple[str, str], task: str,
                metric: str = "val_loss") -> dict | None:
    """A compare-like row of design a − design b (each ``(experiment, design)``), paired by seed
    at equal width: what ``effect`` reads."""
    runs = data.runs
    if runs.empty or metric not in runs:
        return None

    def vals(exp, design):
        g = runs[(runs.experiment == exp) & (runs.design == design) & (runs.task == task)
                 & (runs.arm == "equal") & (runs.status == "done")]
        return dict(zip(g.seed, g[metric]))

    va, vb = vals(*a), vals(*b)
    seeds = sorted(set(va) & set(vb))
    if not seeds:
        return None
    d = paired([va[k] for k in seeds], [vb[k] for k in seeds])
    return {"metric": metric, **d}


def alt_init_sentence(data: StudyData) -> str:
    """Which explanation of alt's difference on translate the numbers support: its random W_h
    at init, or training with the extra matrix. alt_identity starts as standard's function
    with every other weight equal to the random-W_h alt's of the same seed, so alt − alt_identity
    (paired) isolates the init; the rates are each design's own where tuned."""
    rand = effect(pick(rows_of(data, "alt_vs_standard"), design="alt", task="translate",
                       arm="equal", metric="val_loss"))
    ident = effect(pick(rows_of(data, "alt_init"), design="alt_identity", task="translate",
                        arm="equal", metric="val_loss"))
    init = effect(_paired_row(data, ("alt_init", "alt_identity"), ("alt_vs_standard", "alt"),
                              "translate"))
    if "missing" in (rand["status"], ident["status"], init["status"]):
        return ""
    rates = ("each design at its own tuned learning rate" if data.profile.lr_grid else
             "one learning rate for all designs")
    s = (f"Why alt differs on translate ({rates}): with its random W_h alt is {rand['text']} "
         f"vs standard; with W_h = √d_k·I, so that it computes exactly standard's function at "
         f"step 0, {ident['text']} vs standard, and {init['text']} vs the random-W_h alt with "
         f"the same other weights.")
    if rand["status"] not in ("better", "worse"):
        return s + (" The random-W_h alt is not decided different from standard, so there is "
                    "no edge to explain at this scale.")
    # the init matters when starting alt as standard moves it towards standard's result
    moved = init["status"] == ("worse" if rand["status"] == "better" else "better")
    if moved and ident["status"] == "equivalent":
        return s + (" Started as standard, alt ends equivalent to it: the whole difference came "
                    "from the random W_h at init (with the outer 1/√d_k, alt's attention output "
                    "starts about √d_k times smaller), not from what alt can compute.")
    if moved:
        return s + (" Starting alt as standard removes a decided part of its difference: the "
                    "random W_h at init (with the outer 1/√d_k, alt's attention output starts "
                    "about √d_k times smaller) accounts for it, at least in part.")
    if init["status"] == "equivalent":
        return s + (" The two alts end alike, so the difference comes from training with the "
                    "extra matrix (its effect on the updates), not from where alt starts.")
    return s + (" The init comparison is undecided, so the numbers do not yet separate the two "
                "explanations.")


def _scale_sentence(probe: list[dict]) -> str:
    if not probe:
        return ""
    sat, grad = probe_at(probe, "saturated", 0), probe_at(probe, "grad_WQ", 0)
    ent = probe_at(probe, "norm_entropy", 0)
    dk = max(k[1] for k in sat) if sat else None
    if dk is None:
        return ""
    parts = []
    for scale in ("inside", "outside", "both", "none"):
        if (scale, dk) in sat:
            parts.append(f"{scale}: {ci_text([100 * v for v in sat[(scale, dk)]], '{:.0f}', '%')} "
                         f"saturated rows, normalized entropy "
                         f"{ci_text(ent.get((scale, dk), []), '{:.2f}')}, ‖∇W_Q‖ "
                         f"{ci_text(grad.get((scale, dk), []), '{:.2g}')}")
    s = (f"Scale placement at init (unit-variance q, k; d_k = {dk}): " + "; ".join(parts) + ".")
    sat_m = {k: mean_ci(sat.get((k, dk), []))["mean"] for k in ("inside", "outside", "none")}
    g_m = {k: mean_ci(grad.get((k, dk), []))["mean"] for k in ("inside", "none")}
    if finite(sat_m["inside"]) and finite(sat_m["none"]):
        if sat_m["none"] > sat_m["inside"] + 0.05:
            s += " Without 1/√d_k inside the softmax the rows saturate"
            s += (" and the gradient reaching W_Q shrinks, as the seed-001 comment warns"
                  if finite(g_m["none"]) and g_m["none"] < g_m["inside"] else
                  " (the gradient reaching W_Q at init is not smaller here, unlike the seed-001 "
                  "comment's worry)")
            s += ("; an outer factor does not prevent it." if finite(sat_m["outside"])
                  and sat_m["outside"] > sat_m["inside"] + 0.05 else ".")
        else:
            s += f" The saturation gap between 'none' and 'inside' is small: {INCONCLUSIVE}."
    return s


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
    for design, label in (("tied_qk", "tied Q=K"), ("tied_qkv", "one matrix Q=K=V")):
        for task in ("lm", "mlm", "mqar", "relation"):
            lower = task in ("lm", "mlm")
            eq, mt = _task_effects(rows, design, task, lower, data)
            if eq["status"] != "missing":
                s = (f"{label} on {task}: {eq['text']} at equal width, {mt['text']} "
                     f"parameter-matched")
                (head if task in ("lm", "relation") else parts).append(s)
    base = [standard_level(rows, t, data) for t in ("relation", "mqar")]
    base = [b for b in base if b]
    headline = ("; ".join(head) + "." if head else "No tied Q=K runs finished.") + \
        (" Standard reaches " + "; ".join(base) + "." if base and head else "")
    details = ["; ".join(parts) + "."] if parts else []
    if "mqar" in data.profile.task_seeds and not data.profile.task_seeds["mqar"]:
        details.append(MQAR_LEFT_OUT)
    own = records(data.measure("own_position"))
    if own:
        def ow(design, task="lm"):
            return [r["own_weight"] for r in own if r["design"] == design and r["task"] == task]
        uni = [r["uniform"] for r in own if r["task"] == "lm"]
        details.append(
            f"Weight a head puts on its own position (lm, uniform spread would give "
            f"{ci_text(uni, '{:.2f}')}): standard {ci_text(ow('standard'), '{:.2f}')}, tied Q=K "
            f"{ci_text(ow('tied_qk'), '{:.2f}')}, tied Q=K with the self-mask "
            f"{ci_text(ow('tied_qk_selfmask'), '{:.2f}')}, Q=K=V {ci_text(ow('tied_qkv'), '{:.2f}')}.")
    pre = []
    pt = data.measure("pretrained")
    if not pt.empty:
        summ = pt[(pt.level == "summary")]
        for (source, role), g in summ.groupby(["spec.source", "role"], sort=False):
            by = g.set_index("measure")
            if "symmetry" not in by.index:
                continue
            s, layer = by.loc["symmetry"], by.loc["symmetry_layer"] if "symmetry_layer" in \
                by.index else None
            # Saponati et al. score the whole layer's W_QK (heads summed): compare that one.
            whole = (f"whole layer {layer['mean']:.2f} (null {layer['null_mean']:+.3f}), "
                     if layer is not None else "")
            pre.append(f"{source} {role}: {whole}per head {s['mean']:.2f} (random null "
                       f"{s['null_mean']:+.3f} ± {s['null_std']:.3f} sd)")
    if pre:
        pub = data.published
        ref = ", ".join(f"{k} {v:.2f}" for k, v in pub.items() if k in ("BERT-base", "GPT-2"))
        details.append("Symmetry s of W_QK in pretrained models: " + "; ".join(pre)
                       + f". Published reference values for whole layers (not measured here): "
                       f"{ref} ({data.published_source}).")
    details.append(directed_sentence(data))
    details.append(large_heads(data))
    details.append(decoders_vs_published(data))
    details.append(tie_cost_sentence(data, ("qk", "qkv")))
    details.append(_emergence_sentence(data))
    return Verdict(headline, tuple(d for d in details if d))


DIRECTED_KINDS = (("successor", "encoder"), ("successor_causal", "decoder"))


def directed_sentence(data: StudyData) -> str:
    """Tied Q=K (with and without the self-mask) on a relation between contents, the encoder
    and the decoder version side by side, with standard's accuracy and chance."""
    rows = rows_of(data, "directed_relation")
    eff = {(d, t): _task_effects(rows, d, t, False, data)[0]
           for d in ("tied_qk", "tied_qk_selfmask") for t, _ in DIRECTED_KINDS}
    if all(e["status"] == "missing" for e in eff.values()):
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
         + "; " + "; ".join(f"{label} in the {kind}: {eff[(d, t)]['text']}"
                            for d, label in (("tied_qk", "tied Q=K"),
                                             ("tied_qk_selfmask", "with the self-mask"))
                            for t, kind in DIRECTED_KINDS) + ".")
    enc = eff[("tied_qk", "successor")]["status"]
    if enc in ("equivalent", "better"):
        s += (" Since no symmetric score orders a cycle, an encoder that keeps up with standard "
              "routes the direction around its heads: attention can fetch both neighbours and "
              "the readout, which sees the query token through the residual stream, pick the "
              "next one. One head need not hold one directed relation.")
    return s


def emergence_series(data: StudyData) -> dict[str, dict[int, list[float]]]:
    """``{kind: {step: [symmetry over seeds]}}`` of the encoder/decoder self-attention."""
    sym = data.measure("symmetry_steps")
    out: dict[str, dict[int, list[float]]] = {}
    if sym.empty:
        return out
    own = sym[sym.role == sym.kind]  # the encoder's encoder layers, the decoder's decoder layers
    for (kind, step), g in own.groupby(["kind", "step"]):
        out.setdefault(kind, {})[int(step)] = g.sort_values("seed").symmetry.tolist()
    return out


def _emergence_sentence(data: StudyData) -> str:
    ser = emergence_series(data)
    if "encoder" not in ser or "decoder" not in ser:
        return ""
    n_enc, n_dec = max(ser["encoder"]), max(ser["decoder"])  # each at the end of its training
    enc, dec = ser["encoder"][n_enc], ser["decoder"][n_dec]
    s = (f"Trained from the same initial weights, qkvlab's encoder (mlm, {n_enc} steps) "
         f"reaches symmetry {ci_text(enc, '{:.3f}')} and its decoder (lm, {n_dec} steps) "
         f"{ci_text(dec, '{:.3f}')}")
    if len(enc) == len(dec) and len(enc) >= 2:  # same seeds: paired, encoder − decoder
        d = paired(enc, dec)
        margin = MARGINS["symmetry"].value
        v = decide(d["diff"], d["diff_sd"], d["n_pairs"], margin, lower_is_better=False)
        diff = f"difference {d['diff']:+.3f} ± {v['half']:.3f}"
        if v["status"] == "equivalent":
            s += f": equally symmetric ({diff}, 90% CI inside ±{margin:g})."
        elif v["status"] == "better":
            s += f": the encoder is more symmetric ({diff})."
        elif v["status"] == "worse":
            s += f": the decoder is more symmetric ({diff})."
        else:
            more = f"; ≈{v['seeds']} seeds would decide it" if v["seeds"] else ""
            s += f" ({diff}: undecided, the CI straddles zero and reaches past ±{margin:g}{more})."
    else:
        s += f" ({INCONCLUSIVE}: too few seeds for a CI)."
    return s + _unlearned(data, "symmetry_emergence", (("mlm", "encoder"), ("lm", "decoder")))


def _unlearned(data: StudyData, experiment: str, tasks) -> str:
    """A caveat naming each kind whose standard runs in ``experiment`` did not halve a
    context-free guess's perplexity (their weights' geometry then says little)."""
    runs = data.runs
    if runs.empty or "val_loss" not in runs:
        return ""
    out = []
    for task, kind in tasks:
        v = runs[(runs.experiment == experiment) & (runs.task == task)].val_loss.dropna()
        ch = chance(task, data.profile)
        if len(v) and ch is not None and v.mean() > ch - LN2:
            out.append(f"the {kind} ({task}) has not learned its task at this budget (val loss "
                       f"{v.mean():.3f}, context-free {ch:.3f}), so its symmetry says little")
    return (" Caveat: " + "; ".join(out) + ".") if out else ""


# ---- Q3 --------------------------------------------------------------------------------------
def width_needed(data: StudyData) -> pd.DataFrame:
    """bind_codes: per m, design and arm, the smallest d_head whose mean accuracy over seeds
    reaches ``WIDTH_ACCURACY`` (NA if none tried does), the widest tried, and the mean
    accuracy at d_head = m (the width the claim says standard needs)."""
    cols = ["m", "design", "arm", "needed", "widest", "acc_at_m", "n"]
    df = data.compared("bind_vs_dhead", metric="accuracy")
    if df.empty or "m" not in df:
        return pd.DataFrame(columns=cols)
    out = []
    for (m, design, arm), g in df.groupby(["m", "design", "arm"], sort=True):
        ok = g[g["mean"] >= WIDTH_ACCURACY].d_head
        at_m = g[g.d_head == m]["mean"]
        out.append({"m": int(m), "design": design, "arm": arm,
                    "needed": int(ok.min()) if len(ok) else pd.NA,
                    "widest": int(g.d_head.max()),
                    "acc_at_m": float(at_m.iloc[0]) if len(at_m) else float("nan"),
                    "n": int(g["n"].min())})
    return pd.DataFrame(out, columns=cols)


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
    b = data.budget
    if b.empty:
        return ""
    d, s = b[(b.task == task) & (b.design == design)], b[(b.task == task) & (b.design == "standard")]
    if d.empty or s.empty:
        return ""
    d, s = d.iloc[0], s.iloc[0]
    half, full = d.half - s.half, d.full - s.full
    text = (f"Its mean val-loss gap to standard on {task} is {half:+.3f} at step {d.half_step} "
            f"and {full:+.3f} at step {d.steps}")
    if half > 0 and full < 0.75 * half:
        return text + (": still closing, so at this budget the perplexity cost above overstates what the "
                       "tie costs a model trained to the end.")
    return text + "."


def verdict_q3(data: StudyData) -> Verdict:
    lm = rows_of(data, "lm_tied_kv", "lm_gqa")
    eq, mt = _task_effects(lm, "tied_kv", "lm", True)
    headline = (f"tied K=V: {eq['text']} on lm at equal width (published reference ≈ "
                f"+{REF_KV_PPL_PCT}% perplexity at 300M–1.2B parameters, {REF_KV_CITE}); "
                f"{mt['text']} parameter-matched.")
    details = []
    trend = gap_trend(data, "lm", "tied_kv")
    if trend:
        details.append(trend)
    width = width_sentence(data)
    if width:
        details.append(width)
    tr = rows_of(data, "kv_translate")
    teq, tmt = _task_effects(tr, "tied_kv_cross", "translate", True)
    chrf = effect(pick(tr, design="tied_kv_cross", arm="equal", metric="chrf"),
                  lower_is_better=False, what="chrF")
    if teq["status"] != "missing":
        s = (f"Translation with tied K=V in cross-attention (the thread's 'for translation K "
             f"should be the same with V'): {teq['text']} at equal width, {tmt['text']} "
             f"parameter-matched; {chrf['text']}.")
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
            f"{effect(g)['text']} on lm, tied K=V {eq['text']}.")
    details.append(tie_cost_sentence(data, ("kv", "gqa")))
    return Verdict(headline, tuple(d for d in details if d))


def all_verdicts(data: StudyData) -> dict[str, Verdict]:
    return {"q1": verdict_q1(data), "q2": verdict_q2(data), "q3": verdict_q3(data)}
