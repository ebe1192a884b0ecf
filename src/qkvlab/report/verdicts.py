"""Verdict sentences generated from the measured numbers and their 95% confidence intervals.

Rules every sentence follows:
- an effect is written as mean ± CI half-width of the paired difference to ``standard``:
  relative % for losses, percentage points for accuracies;
- a CI that straddles zero, or a single seed (no CI), reads "inconclusive at this scale";
- a conclusion ("adds cost, not expressivity") is written only when the numbers support it.
Each ``verdict_qN(data)`` returns ``{"headline": str, "details": [str, ...]}``.
"""

from __future__ import annotations

import math
from typing import Any

from qkvlab.report import sources as S

INCONCLUSIVE = "inconclusive at this scale"
# Published reference (not measured here): tied K=V costs about +3.1% perplexity at
# 300M-1.2B parameters (Kayyam et al., ICML 2026, arXiv 2606.04032; ../shared/REFERENCES.md).
REF_KV_PPL_PCT = 3.1
REF_KV_CITE = "Kayyam et al. 2026, arXiv 2606.04032"


# metric -> (factor, unit) for metrics whose differences read as points, not relative %
POINTS = {"accuracy": (100.0, " pp"), "chrf": (1.0, " points")}


def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def effect(c: dict | None, lower_is_better: bool = True, what: str | None = None,
           chance: float | None = None) -> dict[str, Any]:
    """``{"text", "status", "value", "half"}`` for one ``compare`` row vs standard.

    ``status`` is ``worse``, ``better``, ``same`` (every seed's pair scored exactly alike),
    ``inconclusive`` or ``missing``. With ``chance``
    (an accuracy task's guessing rate), a comparison where neither design got clearly above
    chance (< 1.5× chance) is ``inconclusive``: a difference between two guessers is noise.
    """
    if not c or "diff" not in c or not _ok(c.get("diff")):
        return {"text": "not measured", "status": "missing", "value": None, "half": None}
    if chance is not None and _ok(c.get("mean")) and _ok(c.get("baseline_mean")) \
            and max(c["mean"], c["baseline_mean"]) < 1.5 * chance:
        return {"text": f"both at chance ({100 * c['mean']:.1f}% vs standard "
                        f"{100 * c['baseline_mean']:.1f}%, chance {100 * chance:.1f}%: "
                        f"not learned, {INCONCLUSIVE})",
                "status": "inconclusive", "value": None, "half": None, "at_chance": True}
    metric = c.get("metric", "")
    what = what or metric.replace("_", " ")
    if metric in POINTS:  # scores already on a 0-1 or 0-100 scale: differences in points
        k, unit = POINTS[metric]
        value, half = k * c["diff"], k * c["diff_half"]
    else:
        value, half, unit = c["rel_pct"], c["rel_half"], "%"
    if not _ok(half):
        return {"text": f"{value:+.1f}{unit} {what} from {c.get('n_pairs', 1)} seed "
                        f"(no CI: {INCONCLUSIVE})", "status": "inconclusive",
                "value": value, "half": None}
    text = f"{value:+.1f}{unit} ± {half:.1f}{unit} {what}"
    if c["diff"] == 0 and c["diff_half"] == 0:  # every seed's pair equal, e.g. both at 100%
        return {"text": f"no difference ({text}: every seed scores the same for both)",
                "status": "same", "value": value, "half": half}
    if value - half <= 0 <= value + half:
        return {"text": f"{text} ({INCONCLUSIVE}: the CI straddles zero)",
                "status": "inconclusive", "value": value, "half": half}
    worse = (value > 0) == lower_is_better
    return {"text": f"{text} ({'worse' if worse else 'better'})",
            "status": "worse" if worse else "better", "value": value, "half": half}


def pick(rows: list[dict], **tags) -> dict | None:
    """The first row whose fields equal ``tags``."""
    for r in rows:
        if all(r.get(k) == v for k, v in tags.items()):
            return r
    return None


def ci_text(values: list[float], fmt: str = "{:.3g}", unit: str = "") -> str:
    """``mean ± half`` over seeds (``mean`` alone, with the seed count, if only one)."""
    m = S.mean_ci(values)
    if not m["n"]:
        return "n/a"
    if not _ok(m["half"]):
        return f"{fmt.format(m['mean'])}{unit} (1 seed)"
    return f"{fmt.format(m['mean'])}{unit} ± {fmt.format(m['half'])}{unit}"


def chance_of(task: str, profile: str | None) -> float | None:
    """Guessing accuracy of a task at a profile's options (None for tasks without one)."""
    from qkvlab.data import get_task
    from qkvlab.experiments.registry import TASK_OPTIONS

    if profile is None:
        return None
    opts = TASK_OPTIONS.get(profile, {}).get(task, {})
    return getattr(get_task(task, **opts), "chance", None)


def _task_effects(rows: list[dict], design: str, task: str, lower: bool,
                  profile: str | None = None) -> tuple[dict, dict]:
    metric = "accuracy" if not lower else "val_loss"
    chance = None if lower else chance_of(task, profile)
    eq = effect(pick(rows, design=design, task=task, arm="equal", metric=metric), lower, chance=chance)
    mt = effect(pick(rows, design=design, task=task, arm="matched", metric=metric), lower, chance=chance)
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


def verdict_q1(data: dict) -> dict[str, Any]:
    q = data["q1"]
    eq, mt = _task_effects(q["loss"], "alt", "lm", True)
    teq, tmt = _task_effects(q["loss"], "alt", "translate", True)
    headline = (f"alt (4th matrix, outer 1/√d_k) vs standard: {eq['text']} on lm at equal width, "
                f"{mt['text']} parameter-matched; on translate {teq['text']} at equal width, "
                f"{tmt['text']} parameter-matched.")
    details = []
    fold = q["fold"]
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
        faster = S.mean_ci([f["speed_folded_vs_alt"] for f in fold])["mean"] > 1.0
        cost = "parameters and time" if faster else "parameters"
        if exact and not_better:
            s += f": the 4th matrix adds {cost}, not expressivity."
        elif exact:
            s += ": alt computes nothing standard cannot; any gain is in optimization, not capacity."
        else:
            s += "."
        details.append(s)
    details.append(_scale_sentence(q["probe"]))
    conv = {d: [r["outside_share"] for r in q["convex"] if r["design"] == d]
            for d in ("standard", "alt")}
    ratio = {d: [r["range_ratio"] for r in q["convex"] if r["design"] == d]
             for d in ("standard", "alt")}
    if conv["standard"] and conv["alt"]:
        details.append(
            f"Convex combination: a standard head's output leaves its values' range in "
            f"{ci_text([100 * v for v in conv['standard']], '{:.2f}', '%')} of coordinates, an alt "
            f"head's in {ci_text([100 * v for v in conv['alt']], '{:.1f}', '%')} (output range / "
            f"value range: {ci_text(ratio['standard'], '{:.2f}')} vs "
            f"{ci_text(ratio['alt'], '{:.2f}')}).")
    return {"headline": headline, "details": [d for d in details if d]}


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
    sat_m = {k: S.mean_ci(sat.get((k, dk), []))["mean"] for k in ("inside", "outside", "none")}
    g_m = {k: S.mean_ci(grad.get((k, dk), []))["mean"] for k in ("inside", "none")}
    if _ok(sat_m["inside"]) and _ok(sat_m["none"]):
        if sat_m["none"] > sat_m["inside"] + 0.05:
            s += " Without 1/√d_k inside the softmax the rows saturate"
            s += (" and the gradient reaching W_Q shrinks, as the seed-001 comment warns"
                  if _ok(g_m["none"]) and g_m["none"] < g_m["inside"] else
                  " (the gradient reaching W_Q at init is not smaller here, unlike the seed-001 "
                  "comment's worry)")
            s += ("; an outer factor does not prevent it." if _ok(sat_m["outside"])
                  and sat_m["outside"] > sat_m["inside"] + 0.05 else ".")
        else:
            s += f" The saturation gap between 'none' and 'inside' is small: {INCONCLUSIVE}."
    return s


# ---- Q2 --------------------------------------------------------------------------------------
def verdict_q2(data: dict) -> dict[str, Any]:
    q = data["q2"]
    head, parts = [], []
    for design, label in (("tied_qk", "tied Q=K"), ("tied_qkv", "one matrix Q=K=V")):
        for task in ("lm", "mlm", "mqar", "relation"):
            lower = task in ("lm", "mlm")
            eq, mt = _task_effects(q["tasks"], design, task, lower, data.get("meta", {}).get("profile"))
            if eq["status"] != "missing":
                s = (f"{label} on {task}: {eq['text']} at equal width, {mt['text']} "
                     f"parameter-matched")
                (head if task in ("lm", "relation") else parts).append(s)
    headline = "; ".join(head) + "." if head else "No tied Q=K runs finished."
    details = ["; ".join(parts) + "."] if parts else []
    own = q["own"]
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
    for r in q["pretrained"]:
        for role in ("encoder", "decoder", "cross"):
            k, kl = f"summary/{role}/symmetry", f"summary/{role}/symmetry_layer"
            if f"{k}/mean" in r:
                # Saponati et al. score the whole layer's W_QK (heads summed): compare that one.
                layer = (f"whole layer {r[kl + '/mean']:.2f} (null {r[kl + '/null_mean']:+.3f}), "
                         if f"{kl}/mean" in r else "")
                pre.append(f"{r['source']} {role}: {layer}per head {r[k + '/mean']:.2f} (random "
                           f"null {r[k + '/null_mean']:+.3f} ± {r[k + '/null_std']:.3f} sd)")
    if pre:
        pub = q["published"]
        ref = ", ".join(f"{k} {v:.2f}" for k, v in pub.items() if k in ("BERT-base", "GPT-2"))
        details.append("Symmetry s of W_QK in pretrained models: " + "; ".join(pre)
                       + f". Published reference values for whole layers (not measured here): "
                       f"{ref} ({q['published_source']}).")
    details.append(_emergence_sentence(q["emergence"]))
    return {"headline": headline, "details": [d for d in details if d]}


def emergence_series(rows: list[dict]) -> dict[str, dict[int, list[float]]]:
    """``{kind: {step: [symmetry over seeds]}}`` of the encoder/decoder self-attention."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        for k, v in r.items():
            if "/step" in k and k.split("/")[0] in ("encoder", "decoder"):
                out.setdefault(r["kind"], {}).setdefault(int(k.split("/step")[1]), []).append(v)
    return out


def _emergence_sentence(rows: list[dict]) -> str:
    ser = emergence_series(rows)
    if "encoder" not in ser or "decoder" not in ser:
        return ""
    last = max(set(ser["encoder"]) & set(ser["decoder"]))
    enc, dec = ser["encoder"][last], ser["decoder"][last]
    s = (f"Trained from the same initial weights for {last} steps, qkvlab's encoder (mlm) "
         f"reaches symmetry {ci_text(enc, '{:.3f}')} and its decoder (lm) {ci_text(dec, '{:.3f}')}")
    if len(enc) == len(dec) and len(enc) >= 2:
        d = S.paired(enc, dec)
        if d["diff_lo"] > 0:
            s += f": the encoder is more symmetric (difference {d['diff']:+.3f} ± {d['diff_half']:.3f})."
        elif d["diff_hi"] < 0:
            s += f": the decoder is more symmetric (difference {d['diff']:+.3f} ± {d['diff_half']:.3f})."
        else:
            s += f" (difference {d['diff']:+.3f} ± {d['diff_half']:.3f}: {INCONCLUSIVE})."
    else:
        s += f" ({INCONCLUSIVE}: too few seeds for a CI)."
    return s


# ---- Q3 --------------------------------------------------------------------------------------
def ppl_text(c: dict | None) -> str:
    """Perplexity change exp(Δloss) − 1 in %, with the CI mapped through exp."""
    if not c or not _ok(c.get("diff")):
        return "not measured"
    m = 100 * (math.exp(c["diff"]) - 1)
    if not _ok(c.get("diff_half")):
        return f"{m:+.1f}% perplexity (1 seed)"
    lo, hi = 100 * (math.exp(c["diff_lo"]) - 1), 100 * (math.exp(c["diff_hi"]) - 1)
    return f"{m:+.1f}% perplexity (95% CI {lo:+.1f}% … {hi:+.1f}%)"


def bind_gap(rows: list[dict], arm: str = "equal", profile: str | None = None) -> list[tuple[int, dict]]:
    """(d_head, effect) of tied_kv vs standard bind accuracy, by d_head."""
    chance = chance_of("bind", profile)
    return sorted((r["d_head"], effect(r, lower_is_better=False, chance=chance)) for r in rows
                  if r["design"] == "tied_kv" and r.get("arm") == arm
                  and r.get("metric") == "accuracy")


def verdict_q3(data: dict) -> dict[str, Any]:
    q = data["q3"]
    eq, mt = _task_effects(q["lm"], "tied_kv", "lm", True)
    c_eq = pick(q["lm"], design="tied_kv", task="lm", arm="equal", metric="val_loss")
    headline = (f"tied K=V: {eq['text']} on lm at equal width ({ppl_text(c_eq)}; published "
                f"reference ≈ +{REF_KV_PPL_PCT}% perplexity at 300M–1.2B parameters, "
                f"{REF_KV_CITE}); {mt['text']} parameter-matched.")
    details = []
    gaps = bind_gap(q["bind"], profile=data.get("meta", {}).get("profile"))
    if gaps and all(e.get("at_chance") for _, e in gaps):
        details.append("Bind was not learned by either design at any d_head tried (accuracy at "
                       "chance), so this profile cannot say where a K=V gap closes: "
                       + "; ".join(f"d_head {dh}: {e['text']}" for dh, e in gaps) + ".")
    elif gaps:
        # the gap has closed from the first d_head after the last significant one
        last_worse = max((i for i, (_, e) in enumerate(gaps) if e["status"] == "worse"), default=-1)
        s = "Bind accuracy, tied K=V − standard (equal width) by d_head: " + "; ".join(
            f"{dh}: {e['text']}" for dh, e in gaps) + ". "
        if last_worse == len(gaps) - 1:
            s += f"The gap does not close up to d_head = {gaps[-1][0]}."
        elif last_worse < 0:
            s += "No d_head tried shows a significant gap."
        else:
            s += (f"Tied K=V is significantly worse up to d_head = {gaps[last_worse][0]}; from "
                  f"d_head = {gaps[last_worse + 1][0]} on the gap is no longer significant.")
        details.append(s)
    teq, tmt = _task_effects(q["translate"], "tied_kv_cross", "translate", True)
    chrf = effect(pick(q["translate"], design="tied_kv_cross", arm="equal", metric="chrf"),
                  lower_is_better=False, what="chrF")
    if teq["status"] != "missing":
        details.append(f"Translation with tied K=V in cross-attention (the thread's 'for "
                       f"translation K should be the same with V'): {teq['text']} at equal width, "
                       f"{tmt['text']} parameter-matched; {chrf['text']}.")
    dec = q["decode"]
    if dec.get("standard/cache_bytes_per_token"):
        b = dec["standard/cache_bytes_per_token"]
        g = pick(q["lm"], design="gqa_half", task="lm", arm="equal", metric="val_loss")
        details.append(
            f"KV cache per token: tied K=V {dec['tied_kv/cache_bytes_per_token'] / b:.2f}× "
            f"standard's, GQA (n_kv_heads = n_heads/2) {dec['gqa_half/cache_bytes_per_token'] / b:.2f}×;"
            f" batch-1 decode speed {dec['tied_kv/decode_tokens_per_s'] / dec['standard/decode_tokens_per_s']:.2f}× "
            f"and {dec['gqa_half/decode_tokens_per_s'] / dec['standard/decode_tokens_per_s']:.2f}× "
            f"standard's. At that equal cache size GQA costs {effect(g)['text']} on lm, tied K=V "
            f"{eq['text']}.")
    return {"headline": headline, "details": details}


def all_verdicts(data: dict) -> dict[str, dict[str, Any]]:
    return {"q1": verdict_q1(data), "q2": verdict_q2(data), "q3": verdict_q3(data)}
