"""The study's page: typed blocks (``qkvlab.report.blocks``) built from ``results.StudyData``,
laid out as the answers (``answers.py``: a paragraph per question), the summary, one section
per question and the set-up, then written as HTML, Markdown, figures, ``verdicts.json`` and the
comparisons as CSV.

Every number comes from the store through ``StudyData``: nothing is typed in here. The summary
is a forest plot per question and one compact table whose cells are short verdict words
(``text.WORDS``, explained once in ``text.LEGEND``) with the paired difference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from qkvlab.experiments.timing import format_breakdown
from qkvlab.fileio import atomic_dir, atomic_write_text
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
from qkvlab.studies.qkv.compute.agreement import CSV, with_verdicts
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.share import shares
from qkvlab.studies.qkv.compute.zoo import zoo_table
from qkvlab.studies.qkv.plan import claims as C
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import SAPONATI_CITE, SAPONATI_MEASURE
from qkvlab.studies.qkv.render import figures as F
from qkvlab.studies.qkv.render import figures_scaling
from qkvlab.studies.qkv.render.answers import answer_blocks
from qkvlab.studies.qkv.render.cards import card_blocks, cards_json
from qkvlab.studies.qkv.render.convert import convert_blocks, start_blocks
from qkvlab.studies.qkv.render.convert_rates import rate_blocks
from qkvlab.studies.qkv.render.pretrained import published_text
from qkvlab.studies.qkv.render.scale import scale_lead, scale_table
from qkvlab.studies.qkv.render.share import share_table
from qkvlab.studies.qkv.render.tables import (
    budget_table,
    compare_table,
    lr_blocks,
    margins_table,
    scaling_blocks,
    summary_table,
    tie_cost_blocks,
    weight_similarity_table,
)
from qkvlab.studies.qkv.render.text import num, pm, splits_text
from qkvlab.studies.qkv.render.verdicts import all_verdicts
from qkvlab.studies.qkv.render.headwidth import head_width_blocks, head_width_rows
from qkvlab.studies.qkv.render.uptrain import uptrain_blocks, uptrain_rows
from qkvlab.studies.qkv.plan.vocab import TEXT_LOSSES, label

SECTION_IDS = ("answers", "summary", "q1", "q2", "q3", "setup")
# comparisons in the summary table: (experiments, design) rows, equal width


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
                                        "lr", "eval_batches", "test_batches")}
    return (("profile", p.name), ("seeds", ", ".join(map(str, p.seeds))),
            ("scale-probe seeds", ", ".join(map(str, p.probe_seeds))),
            ("model sizes", json.dumps(sizes)),
            ("training per task", json.dumps({k: dict(v) for k, v in p.task_train.items()})),
            ("hardware", (f"{hw.get('cpu_model') or hw.get('machine')}, {hw.get('cpu_count')} "
                          f"cores, {hw.get('torch_threads')} torch threads, "
                          f"GPU: {hw.get('cuda')}")),
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
                                      (*TEXT_LOSSES, "chrf", "bleu")),
                        *scale_table(data)]
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
                                      "self-mask and Q=K=V vs standard",
                                      (*TEXT_LOSSES, "accuracy")),
                          compare_table(data.compared("directed_relation"), "a relation between "
                                        "contents (successor): tied Q=K and tied Q=K + self-mask "
                                        "vs standard, encoder and decoder", ("accuracy",))]
    out += weight_similarity_table(data)
    pt = data.measure("pretrained")
    if pt.empty:
        return out
    summ = pt[pt.level == "summary"]
    zoo = zoo_table(data)
    pub = {(r["model"], r["role"]): f"{published_text(r)} ({r['published_checkpoint']})"
           for r in zoo[zoo.published_model.map(lambda p: isinstance(p, str))]
           .to_dict("records")}
    rows = []
    for (source, role), g in summ.groupby(["spec.source", "role"], sort=False):
        by = g.set_index("measure")
        if "symmetry" not in by.index:
            continue
        cells = [f"{num(by.loc[m, 'mean'])} "
                 f"(null {pm(by.loc[m, 'null_mean'], by.loc[m, 'null_std'])})"
                 if m in by.index else "—"
                 for m in (SAPONATI_MEASURE, "symmetry", "overlap_qk", "overlap_kv",
                           "overlap_qv")]
        rows.append((source, role, num(by.loc["symmetry", "n_heads"]), *cells,
                     pub.get((source, role), "—")))
    out.append(Table(f"Pretrained models: mean over heads (null: random heads of the same shapes, "
                     f"mean ± sd); whole layer: s of Σ_h W_Q[h]·W_K[h]ᵀ, median over layers, "
                     f"the statistic {SAPONATI_CITE} publish, set beside their value for the "
                     f"same checkpoint or, so labelled, the same family (reference only, not "
                     f"measured here).",
                     ("model", "role", "heads", "symmetry s, whole layer (median)",
                      "symmetry s per head", "overlap Q–K", "overlap K–V", "overlap Q–V",
                      "published median"), tuple(rows)))
    return out


def q3_blocks(data: StudyData) -> list[Block]:
    lm = data.compared(("lm_tied_kv", "lm_gqa"))
    if not lm.empty:  # lm_gqa's baseline runs are lm_tied_kv's: show them once
        lm = lm.drop_duplicates(["task", "arm", "design", "metric"])
    out: list[Block] = [
        compare_table(pd.concat([lm, data.compared("kv_translate")], ignore_index=True),
                      "tied K=V (self) and GQA on lm; tied K=V in cross-attention on translate",
                      (*TEXT_LOSSES, "chrf", "bleu")),
        compare_table(data.compared("bind_vs_dhead"), "bind_codes accuracy by m and d_head",
                      ("accuracy",))]
    dec = data.measure("decode_speed")
    if not dec.empty:
        out.append(Table("KV cache and batch-1 greedy decoding (untrained weights, same sizes)",
                         ("design", "KV-cache bytes/token", "decode tokens/s"),
                         tuple((label(r["design"]),
                                num(r["cache_bytes_per_token"]), num(r["decode_tokens_per_s"]))
                               for r in dec.sort_values("design").to_dict("records"))))
    out += tie_cost_blocks(data)
    # what each start saved, the curves, then the rates chosen on val
    out += start_blocks(data) + convert_blocks(data) + rate_blocks(data)
    out += uptrain_blocks(data)
    out += head_width_blocks(data)
    return out


def _answers(data: StudyData, figs: dict[str, list[Figure]]) -> list[Block]:
    """The answer cards, then each answer in full (its paragraph)."""
    full = answer_blocks(data, {"q1": scale_lead(data)})
    cards = card_blocks(data, figs) if not data.comparisons.empty else []
    if not cards:
        return full
    return [full[0], *cards, H("Each answer in full"), *full[1:]]


def build(data: StudyData, figs: dict[str, list[Figure]], verdicts: dict[str, Verdict]
          ) -> list[Block]:
    """The report as blocks."""
    claims, claims_note = C.resolved_claims()
    m, p = data.meta, data.profile
    cores = m.get("environment", {}).get("hardware", {}).get("cpu_count")
    blocks: list[Block] = [
        Title("qkvlab study: why attention is softmax(QKᵀ/√d_k)·V with three projections"),
        Para(f"Profile {p.name}, seeds {', '.join(map(str, p.seeds)) or 'per experiment'}, "
             f"total time "
             f"{m.get('total_s', float('nan')):.0f} s on {cores} CPU cores for this invocation "
             f"(runs reused from the store are not re-run). Every number below is read from the "
             f"results store {m.get('db')}; published numbers appear only as labelled reference "
             f"values."),
        *_answers(data, figs),
        Section("summary", "Summary: each design against standard"), summary_table(data),
        share_table(data), margins_table(p)]
    forest = {q: [f for f in figs.get(q, []) if f.name.startswith("forest_")] for q in figs}
    blocks += [f for q in QUESTIONS for f in forest.get(q, [])]
    blocks += [*figs.get("scaling", []), *scaling_blocks(data)]
    for q, question in QUESTIONS.items():
        blocks += [Section(q, question.title), Para(question.text), verdicts[q],
                   H("Claims in the thread and the experiment that tests each"),
                   Quotes(tuple(Quote(c["quote"], c["thread"] + ("" if c["verified"]
                                                                 else " [shipped copy]"),
                                      f"tested by: {c['tested_by']}") for c in claims[q])),
                   H("Evidence"), *(f for f in figs.get(q, []) if f not in forest[q])]
        blocks += {"q1": q1_blocks, "q2": q2_blocks, "q3": q3_blocks}[q](data)
        if q == "q2" and figs.get("scaling_gap"):
            blocks.append(Para("Tied Q=K and Q=K=V against training budget and model size: "
                               "the scaling figures and tables at the end of Q3."))
        if q == "q3":  # the tied designs of Q2 and Q3 against training budget and size
            blocks += figures_scaling.q_blocks(data, figs.get("scaling_gap", []))
    blocks += [Section("setup", "Set-up: profile, seeds, learning rates, hardware, versions, "
                                "time"), Meta(meta_items(data)), *lr_blocks(data, figs),
               *budget_table(data), Para(splits_text(p)),
               Para(claims_note)]
    blocks += [Para(n, note=True) for n in m.get("notes", [])]
    return blocks


def write_report(data: StudyData, report_dir: Path) -> Path:
    """Figures, ``index.html``, ``report.md``, ``verdicts.json``, the comparisons with
    their verdicts as CSV (``compute.agreement.CSV``) and ``shares.csv`` in ``report_dir``;
    returns the path of ``index.html``. The report is written as a set
    (``fileio.atomic_dir``): into a folder beside ``report_dir`` that replaces it once every
    file is written, so a failure or a kill midway leaves the previous report whole, never a
    page without its CSV or figures."""
    report_dir = Path(report_dir)
    with atomic_dir(report_dir) as folder:
        figs = F.all_figures(data, folder / "figures")
        verdicts = all_verdicts(data)
        write_page(build(data, figs, verdicts), folder)
        atomic_write_text(folder / "answers.json", json.dumps(
            cards_json(data, figs) if not data.comparisons.empty else {}, indent=1,
            ensure_ascii=False))
        atomic_write_text(folder / "verdicts.json", json.dumps(
            {q: {"headline": v.headline, "details": list(v.details)}
             for q, v in verdicts.items()}, indent=1, ensure_ascii=False))
        # every comparison row with its verdict as the tables word it (``qkvlab study --agree``)
        atomic_write_text(folder / CSV, with_verdicts(data).to_csv(index=False))
        # the share of attention's benefit each design gives up (``compute.share``)
        atomic_write_text(folder / "shares.csv", shares(data).to_csv(index=False))
        # the controlled conversion's comparisons with their verdicts (``compute.uptrain``)
        atomic_write_text(folder / "uptrain.csv", uptrain_rows(data).to_csv(index=False))
        # K=V's head-width cells with their verdicts and shares (``compute.headwidth``)
        atomic_write_text(folder / "head_width.csv", head_width_rows(data).to_csv(index=False))
    return report_dir / "index.html"
