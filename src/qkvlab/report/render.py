"""Build the report as a list of blocks, then write it as HTML and as Markdown.

A block is a small tuple the two writers (``html.py``, ``markdown.py``) both understand:
``("h2", id, text)``, ``("p", text)``, ``("claims", [claim dicts])``, ``("figure", Figure)``,
``("table", caption, headers, rows)``, ``("verdict", {headline, details})``, ``("meta", [(k, v)])``.
Every number comes from ``data`` (``collect.collect``): nothing is typed in here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from qkvlab.report import claims as C
from qkvlab.report import figures as F
from qkvlab.report.collect import TASK_METRIC
from qkvlab.report.verdicts import all_verdicts, chance_of, effect

SECTION_IDS = ("summary", "q1", "q2", "q3", "setup")


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


def compare_table(rows: list[dict], caption: str, metrics: tuple[str, ...] | None = None) -> tuple:
    """A table of ``compare`` rows: group, design, params, mean ± CI, paired Δ vs standard."""
    with_dh = any(r.get("d_head") is not None for r in rows)
    headers = ["task", "arm", *(["d_head"] if with_dh else []), "design", "seeds", "params",
               "metric", "mean ± 95% CI", "vs standard", "p"]
    body = []
    for r in rows:
        if metrics and r["metric"] not in metrics:
            continue
        lower = r["metric"] != "accuracy" and r["metric"] not in ("chrf", "tokens_per_s")
        eff = effect(r, lower)["text"] if "diff" in r else ""
        body.append([r.get("task", ""), r.get("arm", ""), *([num(r.get("d_head"))] if with_dh else []),
                     F.LABELS.get(r["design"], r["design"]), str(r["n"]), num(r.get("n_params")),
                     r["metric"], pm(r["mean"], r["half"], 4), eff, num(r.get("p"), 2)])
    return ("table", caption, headers, body)


def summary_table(data: dict) -> tuple:
    tasks = sorted({t for r in data["summary"] for t in r["quality"]})
    headers = ["design", "attention params ×", "attention layer time ×", "KV cache ×",
               "decode tokens/s ×", *[f"{t} ({TASK_METRIC.get(t.split(' ')[0], ('val_loss',))[0]})"
                                      for t in tasks]]
    profile = data["meta"].get("profile")
    chance = {t: chance_of(t.split(" ")[0], profile) for t in tasks}  # accuracy tasks only
    body = []
    for r in data["summary"]:
        q = [effect(r["quality"][t], r["quality"][t]["lower_is_better"],
                    chance=None if r["quality"][t]["lower_is_better"] else chance[t])["text"]
             if t in r["quality"] else "—" for t in tasks]
        body.append([F.LABELS.get(r["design"], r["design"]), num(r.get("attention_params_ratio")),
                     num(r.get("layer_time_ratio")), num(r.get("cache_ratio")),
                     num(r.get("decode_ratio")), *q])
    caption = ("Each design relative to standard (× = ratio to standard; quality: paired "
               "difference at equal width, mean ± 95% CI over seeds).")
    return ("table", caption, headers, body)


def _fig_blocks(figs: list) -> list[tuple]:
    return [("figure", f) for f in figs]


def q1_blocks(data: dict) -> list[tuple]:
    q = data["q1"]
    out = [compare_table(q["loss"] + q["chrf"], "alt vs standard (tokens/s: training throughput)")]
    if q["fold"]:
        out.append(("table", "fold_alt on each trained alt lm model (one row per seed)",
                    ["seed", "max |Δlogit| fp32", "max |Δlogit| fp64", "max |logit|", "params alt",
                     "params folded", "speed folded / alt"],
                    [[str(f["seed"]), num(f["max_abs_diff_fp32"]), num(f["max_abs_diff_fp64"]),
                      num(f["max_abs_logit"]), num(f["params_alt"]), num(f["params_folded"]),
                      num(f["speed_folded_vs_alt"])] for f in q["fold"]]))
    return out


def q2_blocks(data: dict) -> list[tuple]:
    q = data["q2"]
    out = [compare_table(q["tasks"], "tied Q=K, tied Q=K + self-mask and Q=K=V vs standard",
                         ("val_loss", "accuracy"))]
    rows = []
    for r in q["pretrained"]:
        for role in ("encoder", "decoder", "cross"):
            k = f"summary/{role}"
            if f"{k}/symmetry/mean" not in r:
                continue
            rows.append([r["source"], role, num(r.get(f"{k}/symmetry/n_heads"))] + [
                f"{num(r.get(f'{k}/{m}/mean'))} (null {pm(r.get(f'{k}/{m}/null_mean'), r.get(f'{k}/{m}/null_std'))})"
                for m in ("symmetry", "overlap_qk", "overlap_kv", "overlap_qv")])
    if rows:
        pub = "; ".join(f"{k} {v:.2f}" for k, v in q["published"].items())
        caption = (f"Pretrained models: mean over heads (null: random heads of the same shapes, "
                   f"mean ± sd). Published symmetry, reference only: {pub} "
                   f"({q['published_source']}).")
        out.append(("table", caption,
                    ["model", "role", "heads", "symmetry s", "overlap Q–K", "overlap K–V",
                     "overlap Q–V"], rows))
    return out


def q3_blocks(data: dict) -> list[tuple]:
    q = data["q3"]
    out = [compare_table(q["lm"] + q["translate"], "tied K=V (self) and GQA on lm; tied K=V in "
                         "cross-attention on translate", ("val_loss", "chrf")),
           compare_table(q["bind"], "bind accuracy by d_head", ("accuracy",))]
    dec = q["decode"]
    labels = sorted({k.split("/")[0] for k in dec})
    if labels:
        out.append(("table", "KV cache and batch-1 greedy decoding (untrained weights, same sizes)",
                    ["design", "KV-cache bytes/token", "decode tokens/s"],
                    [[F.LABELS.get(d, d), num(dec.get(f"{d}/cache_bytes_per_token")),
                      num(dec.get(f"{d}/decode_tokens_per_s"))] for d in labels]))
    return out


def meta_items(data: dict) -> list[tuple[str, str]]:
    m = data["meta"]
    hw = m["hardware"]
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in m.get("step_s", {}).items())
    counts = "; ".join(f"{k}: " + ", ".join(f"{s} {n}" for s, n in v.items())
                       for k, v in m.get("counts", {}).items())
    return [("profile", m["profile"]), ("seeds", ", ".join(map(str, m["seeds"]))),
            ("scale-probe seeds", ", ".join(map(str, m["probe_seeds"]))),
            ("model sizes", json.dumps(m["sizes"])),
            ("training per task", json.dumps(m.get("task_train", {}))),
            ("hardware", (f"{hw.get('cpu_model') or hw.get('machine')}, {hw.get('cpu_count')} "
                          f"cores, {hw.get('torch_threads')} torch threads, GPU: {hw.get('cuda')}")),
            ("versions", ", ".join(f"{k} {v}" for k, v in m["versions"].items())),
            ("git revision", str(m.get("git_rev"))), ("platform", m["platform"]),
            ("results store", str(m.get("db"))),
            ("total time", f"{m.get('total_s', float('nan')):.0f} s ({steps})"),
            ("runs per experiment", counts or "—")]


def build(data: dict, figs: dict[str, list], verdicts: dict) -> list[tuple]:
    """The report as blocks (see the module docstring)."""
    claims, claims_note = C.resolved_claims()
    m = data["meta"]
    blocks: list[tuple] = [
        ("title", "qkvlab study: why attention is softmax(QKᵀ/√d_k)·V with three projections"),
        ("p", (f"Profile {m['profile']}, seeds {', '.join(map(str, m['seeds']))}, total time "
               f"{m.get('total_s', float('nan')):.0f} s on {m['hardware'].get('cpu_count')} CPU "
               f"cores for this invocation (runs reused from the store are not re-run). Every number below is read from the results store {m.get('db')}; "
               f"published numbers appear only as labelled reference values.")),
        ("h2", "summary", "Summary: each design against standard"), summary_table(data)]
    for q in ("q1", "q2", "q3"):
        title, question = C.QUESTIONS[q]
        blocks += [("h2", q, title), ("p", question), ("verdict", verdicts[q]),
                   ("h3", "Claims in the thread and the experiment that tests each"),
                   ("claims", claims[q]), ("h3", "Evidence")]
        blocks += _fig_blocks(figs.get(q, []))
        blocks += {"q1": q1_blocks, "q2": q2_blocks, "q3": q3_blocks}[q](data)
    blocks += [("h2", "setup", "Set-up: profile, seeds, hardware, versions, time"),
               ("meta", meta_items(data)), ("p", claims_note)]
    for n in m.get("notes", []):
        blocks.append(("note", n))
    return blocks


def write_report(data: dict, report_dir: Path) -> Path:
    """Figures, ``index.html``, ``report.md`` and ``data.json`` in ``report_dir``; returns index."""
    from qkvlab.report import html, markdown

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    figs = F.all_figures(data, report_dir / "figures")
    verdicts = all_verdicts(data)
    blocks = build(data, figs, verdicts)
    index = report_dir / "index.html"
    _atomic(index, html.render(blocks))
    _atomic(report_dir / "report.md", markdown.render(blocks))
    _atomic(report_dir / "verdicts.json", json.dumps(verdicts, indent=1, ensure_ascii=False))
    _atomic(report_dir / "data.json", json.dumps(data, indent=1, default=str, ensure_ascii=False))
    return index


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
