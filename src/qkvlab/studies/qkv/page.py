"""The study's page: typed blocks (``qkvlab.report.blocks``) built from ``results.StudyData``.

Every number comes from the store through ``StudyData``: nothing is typed in here. The summary
is a forest plot per question and one compact table whose cells are short verdict words
(``effects.WORDS``, explained once in ``effects.LEGEND``) with the paired difference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from qkvlab.experiments.timing import format_breakdown
from qkvlab.fileio import atomic_write_text
from qkvlab.report.blocks import (
    Block,
    Figure,
    Meta,
    Para,
    Quote,
    Quotes,
    Section,
    Table,
    Title,
    Verdict,
    write_page,
)
from qkvlab.report.blocks import Heading as H
from qkvlab.studies.qkv import claims as C
from qkvlab.studies.qkv import figures as F
from qkvlab.studies.qkv.effects import LEGEND, cell, effect
from qkvlab.studies.qkv.experiments import MARGINS, TUNED, lr_of, task_lr
from qkvlab.studies.qkv.results import TASK_METRIC, StudyData, row_chance
from qkvlab.studies.qkv.verdicts import all_verdicts, ci_text
from qkvlab.studies.qkv.tie_view import TIE_LABELS, ppl_change, ppl_text, tie_costs, why_refused

SECTION_IDS = ("summary", "q1", "q2", "q3", "setup")
# comparisons in the summary table: (experiments, design) rows, equal width
SUMMARY_SOURCES = ("alt_vs_standard", "tied_qk_qkv", "directed_relation", "lm_tied_kv", "lm_gqa",
                   "kv_translate")


def num(x, digits: int = 3) -> str:
    """A number for a table cell: 3 significant digits, thousands separators, '—' if absent."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def pm(mean, half, digits: int = 3) -> str:
    return num(mean, digits) if half is None or not math.isfinite(half) else \
        f"{num(mean, digits)} ± {num(half, 2)}"


def _lower(metric: str) -> bool:
    return metric not in ("accuracy", "chrf", "bleu", "tokens_per_s")


def compare_table(df: pd.DataFrame, caption: str, metrics: tuple[str, ...] = ()) -> Table:
    """A table of comparison rows: group, design, params, mean ± CI, paired Δ vs standard."""
    if metrics and not df.empty:
        df = df[df.metric.isin(metrics)]
    rows = [] if df.empty else df.to_dict("records")
    def has(col: str) -> bool:
        return any(isinstance(r.get(col), (int, float)) and math.isfinite(r[col]) for r in rows)
    extra = tuple(c for c in ("m", "d_head") if has(c))
    headers = ("task", "arm", *extra, "design", "seeds", "params", "metric", "mean ± 95% CI",
               "vs standard", "p")
    body = []
    for r in rows:
        eff = effect(r, _lower(r["metric"]))["text"] if r["design"] != "standard" else ""
        body.append((str(r.get("task", "")), str(r.get("arm", "")),
                     *(num(r.get(c)) for c in extra),
                     F.LABELS.get(r["design"], r["design"]), str(r["n"]), num(r.get("n_params")),
                     r["metric"], pm(r["mean"], r["half"], 4), eff, num(r.get("p"), 2)))
    return Table(caption, headers, tuple(body))


def _quality(data: StudyData) -> dict[str, dict[str, dict]]:
    """``{design: {task label: comparison row}}`` at equal width, each task's own metric;
    bind_codes at its largest m and d_head = m (``figures.bind_point``)."""
    out: dict[str, dict[str, dict]] = {}
    for exp in SUMMARY_SOURCES:
        for r in data.compared(exp, arm="equal").to_dict("records"):
            if r["design"] != "standard" and r["metric"] == TASK_METRIC[r["task"]][0]:
                out.setdefault(r["design"], {})[r["task"]] = r
    for r in F.bind_point(data.compared("bind_vs_dhead", arm="equal",
                                        metric="accuracy")).to_dict("records"):
        if r["design"] != "standard":
            out.setdefault(r["design"], {})[f"bind_codes (m = d_head = {int(r['m'])})"] = r
    return out


def _cost_ratios(data: StudyData) -> dict[str, dict[str, float]]:
    """Attention parameters, layer time, KV cache and decode speed of each design / standard's."""
    out: dict[str, dict[str, float]] = {}
    runs = data.runs
    if not runs.empty and "params.attention" in runs:
        eq = runs[(runs.arm == "equal") & runs["params.attention"].notna()]
        keys = [c for c in ("experiment", "task", "seed", "d_head") if c in eq]
        base = eq[eq.design == "standard"][keys + ["params.attention"]]
        both = eq[eq.design != "standard"].merge(base, on=keys, suffixes=("", "_std"))
        for d, g in both.groupby("design"):
            out.setdefault(d, {})["params"] = float((g["params.attention"]
                                                     / g["params.attention_std"]).iloc[0])
    speed = data.measure("attention_speed")
    for r in speed.to_dict("records"):
        out.setdefault(r["design"], {})["time"] = r["time_vs_standard"]
    dec = data.measure("decode_speed")
    if not dec.empty and "standard" in set(dec.design):
        d = dec.set_index("design")
        for k in d.index:
            out.setdefault(k, {}).update(
                cache=d.cache_bytes_per_token[k] / d.cache_bytes_per_token["standard"],
                decode=d.decode_tokens_per_s[k] / d.decode_tokens_per_s["standard"])
    out.pop("standard", None)
    return out


def summary_table(data: StudyData) -> Table:
    quality, cost = _quality(data), _cost_ratios(data)
    tasks = sorted({t for q in quality.values() for t in q})
    headers = ("design", "attention params ×", "attention layer time ×", "KV cache ×",
               "decode tokens/s ×",
               *(f"{t} ({TASK_METRIC[t.split(' ')[0]][0]})" for t in tasks))
    body = []
    for design in sorted(set(quality) | (set(cost) & set(quality))):
        cells = []
        for t in tasks:
            r = quality[design].get(t)
            if r is None:
                cells.append("—")
                continue
            lower = TASK_METRIC[t.split(" ")[0]][1]
            e = effect(r, lower, chance=row_chance(r, data.profile))
            cells.append(cell(e))
        c = cost.get(design, {})
        body.append((F.LABELS.get(design, design), num(c.get("params")), num(c.get("time")),
                     num(c.get("cache")), num(c.get("decode")), *cells))
    caption = ("Each design relative to standard (× = ratio to standard; quality: paired "
               "difference at equal width, mean ± 95% CI over seeds: % perplexity for losses, "
               "percentage points of accuracy) and its verdict against the stated margin.")
    return Table(caption, headers, tuple(body), legend=LEGEND)


def lr_blocks(data: StudyData, figs: dict[str, list[Figure]]) -> list[Block]:
    """How each design's learning rate was chosen: the grid's figure and the chosen rates."""
    p = data.profile
    if not p.lr_grid:
        return [Para(f"Learning rates: every design trains at its task's rate (profile "
                     f"{p.name} has no per-design grid): "
                     + ", ".join(f"{t} {task_lr(t, p):g}" for t in TASK_METRIC) + ".")]
    df = F.lr_frame(data)
    chosen = df[df.chosen]
    body = tuple((r.task, F.LABELS.get(r.design, r.design), r.arm, f"{r.lr:g}",
                  num(r.val_loss, 4), "yes: widen the grid" if r.edge else "no")
                 for r in chosen.itertuples())
    grids = "; ".join(f"{t}: {', '.join(f'{lr_of(t, m, p):g}' for m in p.lr_grid)}"
                      for t in TUNED)
    return [Para(f"Learning rates: each design of {', '.join(TUNED)} trains, in each arm "
                 f"(equal width, and parameter-matched: another width, so its own rate), at "
                 f"the rate of its task's grid ({grids}) with the lowest mean validation loss "
                 f"over tuning seeds {', '.join(map(str, p.lr_seeds))} (not the reported "
                 f"seeds)."),
            *figs.get("setup", []),
            Table("Chosen learning rate per design", ("task", "design", "arm", "rate",
                                                      "val loss (tuning seeds)", "at the grid's edge"),
                  body)]


def scaling_blocks(data: StudyData) -> list[Block]:
    """The scaling comparison as a table: each design's effect and verdict per width."""
    df = F.scaling_frame(data)
    if df.empty:
        return []
    rows = data.compared("lm_scaling", metric="val_loss")
    body = tuple((F.LABELS.get(r["design"], r["design"]), str(int(r["d_model"])),
                  num(r.get("baseline_params")), str(int(r["n_pairs"])), cell(effect(r, True)))
                 for r in F.diffs(rows).to_dict("records"))
    return [Table("lm at three widths (same depth and d_head): each design vs standard",
                  ("design", "d_model", "params (standard)", "seeds", "perplexity vs standard"),
                  body, legend=LEGEND)]


def budget_table(data: StudyData) -> list[Block]:
    """Val loss at half and full budget: how far from flat the compared models are."""
    df = data.budget
    if df.empty:
        return []
    body = tuple((r.task, F.LABELS.get(r.design, r.design), str(r.seeds),
                  f"{num(r.half, 4)} (step {r.half_step})", f"{num(r.full, 4)} (step {r.steps})",
                  f"{r.change_pct:+.1f}%") for r in df.itertuples())
    return [Table("Trained how far? Mean val loss over seeds at half and at the full budget "
                  "(equal width). A change much larger than the differences between designs "
                  "means the comparison is of models still learning.",
                  ("task", "design", "seeds", "half budget", "full budget", "change"), body)]


def margins_table() -> Table:
    """The practical margins of the verdicts, with their reasons (fixed before the runs)."""
    return Table("Practical margins, written down before the runs: a 90% CI of the paired "
                 "difference inside ±margin reads 'equivalent'.", ("metric", "margin", "why"),
                 tuple((k, f"±{m.value:g} {m.unit}", m.reason) for k, m in MARGINS.items()))


def meta_items(data: StudyData) -> tuple[tuple[str, str], ...]:
    m, p = data.meta, data.profile
    env = m.get("environment", {})
    hw, versions = env.get("hardware", {}), env.get("versions", {})
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in m.get("step_s", {}).items())
    counts = "; ".join(f"{k}: " + (", ".join(f"{s} {n}" for s, n in v.items()) or "no runs")
                       for k, v in m.get("counts", {}).items())
    st = m.get("sweep_time")
    sweep_time = st and format_breakdown("all experiments", st["parts"], runs=st["runs"],
                                          wall_s=st["wall_s"], workers=st["workers"]
                                          ).splitlines()[0]
    sizes = {k: getattr(p, k) for k in ("d_model", "n_layers", "n_heads", "batch_size", "steps",
                                        "lr", "eval_batches")}
    return (("profile", p.name), ("seeds", ", ".join(map(str, p.seeds))),
            ("scale-probe seeds", ", ".join(map(str, p.probe_seeds))),
            ("model sizes", json.dumps(sizes)),
            ("training per task", json.dumps({k: dict(v) for k, v in p.task_train.items()})),
            ("hardware", (f"{hw.get('cpu_model') or hw.get('machine')}, {hw.get('cpu_count')} "
                          f"cores, {hw.get('torch_threads')} torch threads, GPU: {hw.get('cuda')}")),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
            ("git revision", str(env.get("git_rev"))), ("platform", str(env.get("platform"))),
            ("results store", str(m.get("db"))),
            ("total time", f"{m.get('total_s', float('nan')):.0f} s ({steps})"),
            ("where the training time went", sweep_time or "—"),
            ("runs per experiment", counts or "—"))


def q1_blocks(data: StudyData) -> list[Block]:
    out: list[Block] = [compare_table(data.compared("alt_vs_standard"),
                                      "alt vs standard (tokens/s: training throughput)"),
                        compare_table(data.compared("alt_init"), "alt with W_h = √d_k·I "
                                      "(computes standard's function at step 0) on translate",
                                      ("val_loss", "chrf", "bleu"))]
    fold = data.measure("fold_alt")
    if not fold.empty:
        out.append(Table("fold_alt on each trained alt lm model (one row per seed)",
                         ("seed", "max |Δlogit| fp32", "max |Δlogit| fp64", "max |logit|",
                          "params alt", "params folded", "speed folded / alt"),
                         tuple((str(f["seed"]), num(f["max_abs_diff_fp32"]),
                                num(f["max_abs_diff_fp64"]), num(f["max_abs_logit"]),
                                num(f["params_alt"]), num(f["params_folded"]),
                                num(f["speed_folded_vs_alt"]))
                               for f in fold.sort_values("seed").to_dict("records"))))
    return out


def q2_blocks(data: StudyData) -> list[Block]:
    out: list[Block] = [compare_table(data.compared("tied_qk_qkv"), "tied Q=K, tied Q=K + "
                                      "self-mask and Q=K=V vs standard", ("val_loss", "accuracy")),
                          compare_table(data.compared("directed_relation"), "a relation between "
                                        "contents (successor): tied Q=K and tied Q=K + self-mask "
                                        "vs standard, encoder and decoder", ("accuracy",))]
    out += weight_similarity_table(data)
    pt = data.measure("pretrained")
    if pt.empty:
        return out
    summ = pt[pt.level == "summary"]
    rows = []
    for (source, role), g in summ.groupby(["spec.source", "role"], sort=False):
        by = g.set_index("measure")
        if "symmetry" not in by.index:
            continue
        cells = [f"{num(by.loc[m, 'mean'])} (null {pm(by.loc[m, 'null_mean'], by.loc[m, 'null_std'])})"
                 if m in by.index else "—"
                 for m in ("symmetry", "overlap_qk", "overlap_kv", "overlap_qv")]
        rows.append((source, role, num(by.loc["symmetry", "n_heads"]), *cells))
    pub = "; ".join(f"{k} {v:.2f}" for k, v in data.published.items())
    out.append(Table(f"Pretrained models: mean over heads (null: random heads of the same shapes, "
                     f"mean ± sd). Published symmetry, reference only: {pub} "
                     f"({data.published_source}).",
                     ("model", "role", "heads", "symmetry s", "overlap Q–K", "overlap K–V",
                      "overlap Q–V"), tuple(rows)))
    return out


SIMILARITY = ("symmetry", "overlap_qk", "overlap_kv", "overlap_qv")


def weight_similarity_table(data: StudyData) -> list[Block]:
    """W_Q, W_K, W_V similarity in qkvlab's own trained standard models, mean ± 95% CI over
    seeds, beside the random null (the ``weight_similarity`` measure)."""
    ws = data.measure("weight_similarity")
    if ws.empty:
        return []
    rows = []
    for (task, role), g in ws.groupby(["task", "role"]):
        cells = []
        for m in SIMILARITY:
            sub = g[g.measure == m]
            cells.append("—" if sub.empty else f"{ci_text(sub['mean'].tolist())} (null "
                         f"{num(sub.null_mean.mean())})")
        rows.append((task, role, str(g.seed.nunique()), *cells))
    return [Table("qkvlab's own standard models after training (tied_qk_qkv, equal width): mean "
                  "over heads, then mean ± 95% CI over seeds; null: random heads of the same "
                  "shapes", ("task", "role", "seeds", "symmetry s", "overlap Q–K",
                             "overlap K–V", "overlap Q–V"), tuple(rows))]


def q3_blocks(data: StudyData) -> list[Block]:
    lm = data.compared(("lm_tied_kv", "lm_gqa"))
    if not lm.empty:  # lm_gqa's baseline runs are lm_tied_kv's: show them once
        lm = lm.drop_duplicates(["task", "arm", "design", "metric"])
    out: list[Block] = [
        compare_table(pd.concat([lm, data.compared("kv_translate")], ignore_index=True),
                      "tied K=V (self) and GQA on lm; tied K=V in cross-attention on translate",
                      ("val_loss", "chrf", "bleu")),
        compare_table(data.compared("bind_vs_dhead"), "bind_codes accuracy by m and d_head",
                      ("accuracy",))]
    dec = data.measure("decode_speed")
    if not dec.empty:
        out.append(Table("KV cache and batch-1 greedy decoding (untrained weights, same sizes)",
                         ("design", "KV-cache bytes/token", "decode tokens/s"),
                         tuple((F.LABELS.get(r["design"], r["design"]),
                                num(r["cache_bytes_per_token"]), num(r["decode_tokens_per_s"]))
                               for r in dec.sort_values("design").to_dict("records"))))
    out += tie_cost_blocks(data)
    return out


def tie_cost_blocks(data: StudyData) -> list[Block]:
    """What forcing each tie costs a trained decoder (``tie_view.tie_costs``)."""
    tc = tie_costs(data)
    if tc.empty:
        models = getattr(data.profile, "tie_cost_models", ())
        return [Para("What a tie would cost a trained model: not measured in this store at this "
                     "profile's sizes" + (f" (it measures {', '.join(models)}; see the notes)"
                                          if models else "; `qkvlab tiecost smollm2` stores it")
                     + ".", note=True)]
    rows = tc[(tc.layers.astype(str) == "all") & (tc.stage != "refused")]
    def stage(r: dict) -> str:  # healed rows name the rate validation chose
        lr = r.get("heal_lr")
        if not isinstance(lr, float) or lr != lr:
            return r["stage"]
        return r["stage"] + (f" (lr {lr:g})" if lr else " (no rate helped: as tied)")

    body = tuple((r["title"], TIE_LABELS.get(r["tie"], r["tie"]), stage(r), ppl_text(r["ppl"]),
                  ppl_text(r["ppl_base"]), f"{r['delta_nll']:+.3f}", ppl_change(r["pct"]),
                  num(r["kv_cache"]), num(r["attn_params"]))
                 for r in rows.to_dict("records"))
    refused = tc[tc.stage == "refused"].drop_duplicates(["model", "tie"])
    out: list[Block] = [Table(
        "What each tie costs a trained decoder: every layer tied at once by its best fit on real "
        "activations (K=V: W_V ← W_K·M, M folded into W_O; Q=K: the nearest tied score form; "
        "GQA: kv heads mean-pooled, a reference), held-out Bible perplexity; a healed tie is "
        "compared with the untied model healed the same way (healing on Bible text lowers its "
        "perplexity too), each at the learning rate its validation loss chose. alt folds "
        "exactly, so it costs nothing.",
        ("model", "tie", "stage", "perplexity", "untied, same stage", "Δ nll", "perplexity change",
         "KV cache ×", "attention params ×"), body)]
    if not refused.empty:
        out.append(Para("Ties a model's architecture cannot take: " + "; ".join(
            f"{r['title']} {TIE_LABELS.get(r['tie'], r['tie'])}: {why_refused(r['reason'])}"
            for r in refused.to_dict("records")) + "."))
    return out


def build(data: StudyData, figs: dict[str, list[Figure]], verdicts: dict[str, Verdict]
          ) -> list[Block]:
    """The report as blocks."""
    claims, claims_note = C.resolved_claims()
    m, p = data.meta, data.profile
    cores = m.get("environment", {}).get("hardware", {}).get("cpu_count")
    blocks: list[Block] = [
        Title("qkvlab study: why attention is softmax(QKᵀ/√d_k)·V with three projections"),
        Para(f"Profile {p.name}, seeds {', '.join(map(str, p.seeds))}, total time "
             f"{m.get('total_s', float('nan')):.0f} s on {cores} CPU cores for this invocation "
             f"(runs reused from the store are not re-run). Every number below is read from the "
             f"results store {m.get('db')}; published numbers appear only as labelled reference "
             f"values."),
        Section("summary", "Summary: each design against standard"), summary_table(data),
        margins_table()]
    forest = {q: [f for f in figs.get(q, []) if f.name.startswith("forest_")] for q in figs}
    blocks += [f for q in ("q1", "q2", "q3") for f in forest.get(q, [])]
    blocks += [*figs.get("scaling", []), *scaling_blocks(data)]
    for q in ("q1", "q2", "q3"):
        title, question = C.QUESTIONS[q]
        blocks += [Section(q, title), Para(question), verdicts[q],
                   H("Claims in the thread and the experiment that tests each"),
                   Quotes(tuple(Quote(c["quote"], c["thread"] + ("" if c["verified"]
                                                                 else " [shipped copy]"),
                                      f"tested by: {c['tested_by']}") for c in claims[q])),
                   H("Evidence"), *(f for f in figs.get(q, []) if f not in forest[q])]
        blocks += {"q1": q1_blocks, "q2": q2_blocks, "q3": q3_blocks}[q](data)
    blocks += [Section("setup", "Set-up: profile, seeds, learning rates, hardware, versions, "
                                "time"), Meta(meta_items(data)), *lr_blocks(data, figs),
               *budget_table(data),
               Para(claims_note)]
    blocks += [Para(n, note=True) for n in m.get("notes", [])]
    return blocks


def write_report(data: StudyData, report_dir: Path) -> Path:
    """Figures, ``index.html``, ``report.md``, ``verdicts.json`` and the comparisons as CSV in
    ``report_dir``; returns the path of ``index.html``."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    figs = F.all_figures(data, report_dir / "figures")
    verdicts = all_verdicts(data)
    index = write_page(build(data, figs, verdicts), report_dir)
    atomic_write_text(report_dir / "verdicts.json", json.dumps(
        {q: {"headline": v.headline, "details": list(v.details)} for q, v in verdicts.items()},
        indent=1, ensure_ascii=False))
    atomic_write_text(report_dir / "comparisons.csv", data.comparisons.to_csv(index=False))
    return index
