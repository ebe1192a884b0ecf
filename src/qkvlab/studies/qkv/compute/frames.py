"""Tables derived from ``results.StudyData`` that the page, the figures and the verdict
sentences share: comparison rows picked by tags, paired differences between two designs, each
design's effects per task, the width price, the symmetry series, the summary's quality and cost
ratios, and the frames behind the forest, scaling and learning-rate figures. Everything is
computed from stored results; nothing here formats text.
"""

from __future__ import annotations

import pandas as pd

from qkvlab.stats import mean_ci, paired
from qkvlab.studies.qkv.compute.effects import Effect, effect
from qkvlab.studies.qkv.compute.results import (
    StudyData,
    chance,
    in_comparison,
    row_chance,
    scored_on_test,
    select,
)
from qkvlab.studies.qkv.plan.experiments import WIDTH_ACCURACY
from qkvlab.studies.qkv.plan.questions import QUESTIONS, summary_sources
from qkvlab.studies.qkv.plan.rates import grid_choices
from qkvlab.studies.qkv.plan.vocab import (
    ARMS,
    CONTROL,
    KV_DESIGNS,
    TASK_METRIC,
    reported,
)

def pick(rows: list[dict], **tags) -> dict | None:
    """The first row whose fields equal ``tags``."""
    for r in rows:
        if all(r.get(k) == v for k, v in tags.items()):
            return r
    return None


def rows_of(data: StudyData, *experiments: str) -> list[dict]:
    """Comparison rows of some experiments as dicts (what the sentences read)."""
    return data.compared(experiments).to_dict("records")


def records(df) -> list[dict]:
    return [] if df is None or df.empty else df.to_dict("records")


def diffs(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a comparison frame that have a paired difference to standard."""
    if df.empty or "diff" not in df:
        return df.iloc[0:0]
    return df[(df.design != "standard") & df["diff"].notna()]


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The non-empty frames one under the other (an empty frame if none)."""
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def ci_rows(df: pd.DataFrame, by: list[str], col: str, factor: float = 1.0) -> pd.DataFrame:
    """mean ± 95% CI of ``factor * col`` over the rows of each group of ``by``."""
    rows = [{**dict(zip(by, key)), **mean_ci((factor * g[col]).tolist())}
            for key, g in df.groupby(by, sort=True)]
    return pd.DataFrame(rows)[[*by, "n", "mean", "half"]]


def bind_point(rows: pd.DataFrame) -> pd.DataFrame:
    """bind_codes' comparison rows at the largest m and d_head = m: where standard has just
    the width the task needs, so a design that needs more shows it."""
    if rows.empty or "m" not in rows:
        return rows.iloc[0:0]
    m = rows.m.max()
    return rows[(rows.m == m) & (rows.d_head == m)]


def q3_lm(data: StudyData) -> pd.DataFrame:
    """lm comparisons of lm_tied_kv and lm_gqa (Q3's ``pooled`` experiments)."""
    return pooled(data, QUESTIONS["q3"].pooled)


def pooled(data: StudyData, experiments: tuple[str, ...]) -> pd.DataFrame:
    """The comparisons of experiments that share their standard and control runs, as one:
    the later experiments' standard and control rows (the same runs) dropped."""
    df = data.compared(experiments)
    if df.empty:
        return df
    keys = [c for c in ("task", "arm", "d_head", "design", "metric") if c in df]
    dup = df.duplicated(subset=keys) & df.design.isin(["standard", CONTROL])
    return df[~dup]


def paired_row(data: StudyData, a: tuple[str, str], b: tuple[str, str], task: str,
                metric: str = "val_loss") -> dict | None:
    """A compare-like row of design a − design b (each ``(experiment, design)``), paired by seed
    at equal width on ``metric`` (a ``vocab.METRICS`` row), on the test split
    (``vocab.reported``: the stored metric the row names, scored on test): what ``effect`` reads."""
    runs, col = data.runs, reported(metric)
    if runs.empty or col not in runs:
        return None

    def vals(exp, design):
        g = runs[(runs.experiment == exp) & (runs.design == design) & (runs.task == task)
                 & (runs.arm == "equal") & (runs.status == "done")]
        g = scored_on_test(g)
        return dict(zip(g.seed, g[col]))

    va, vb = vals(*a), vals(*b)
    seeds = sorted(set(va) & set(vb))
    if not seeds:
        return None
    d = paired([va[k] for k in seeds], [vb[k] for k in seeds])
    return {"metric": metric, **d}


def task_effects(rows: list[dict], design: str, task: str, data: StudyData | None = None
                 ) -> tuple[Effect, Effect]:
    """A design's effects on a task's own metric at equal width and parameter-matched (judged
    against the task's chance level when ``data`` is given)."""
    metric = TASK_METRIC[task]
    ch = None if data is None else chance(task, data.profile)
    eq = effect(pick(rows, design=design, task=task, arm="equal", metric=metric), chance=ch)
    mt = effect(pick(rows, design=design, task=task, arm="matched", metric=metric), chance=ch)
    return eq, mt


def probe_at(probe: list[dict], stat: str, step: int | None = None) -> dict[tuple, list[float]]:
    """``{(scale, d_head): [values over seeds]}`` of a probe statistic at ``step`` (first if
    None)."""
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


def quality(data: StudyData) -> dict[str, dict[str, dict]]:
    """``{design: {task label: comparison row}}`` at equal width, each task's own metric;
    bind_codes at its largest m and d_head = m (``bind_point``)."""
    out: dict[str, dict[str, dict]] = {}
    for exp in summary_sources():
        for r in data.compared(exp, arm="equal").to_dict("records"):
            if r["design"] != "standard" and r["metric"] == TASK_METRIC[r["task"]]:
                out.setdefault(r["design"], {})[r["task"]] = r
    for r in bind_point(data.compared("bind_vs_dhead", arm="equal",
                                        metric="accuracy")).to_dict("records"):
        if r["design"] != "standard":
            out.setdefault(r["design"], {})[f"bind_codes (m = d_head = {int(r['m'])})"] = r
    return out


def cost_ratios(data: StudyData) -> dict[str, dict[str, float]]:
    """Attention parameters, layer time, KV cache and decode speed of each design / standard's."""
    out: dict[str, dict[str, float]] = {}
    runs = data.runs
    if not runs.empty and "params.attention" in runs:
        eq = runs[(runs.arm == "equal") & runs["params.attention"].notna()
                  & in_comparison(runs)]
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


def decode_ratios(data: StudyData) -> pd.DataFrame:
    """Cache bytes/token and decode tokens/s relative to standard, from one decode_speed
    measure (the first, if the store holds several at this profile)."""
    dec = data.measure("decode_speed")
    if dec.empty or "design" not in dec:
        return pd.DataFrame()
    dec = dec[dec.measure_id == dec.measure_id.iloc[0]].set_index("design")
    if "standard" not in dec.index:
        return pd.DataFrame()
    base = dec.loc["standard"]
    return pd.DataFrame([{"design": d,
                          "cache_vs_standard": dec.loc[d, "cache_bytes_per_token"]
                          / base.cache_bytes_per_token,
                          "decode_vs_standard": dec.loc[d, "decode_tokens_per_s"]
                          / base.decode_tokens_per_s}
                         for d in KV_DESIGNS if d in dec.index])


def forest_frame(data: StudyData, question: str) -> pd.DataFrame:
    """The rows of a question's forest plot: panel, design, task, arm, d_head, value, half.

    value (lo … hi: 95% CI) is the paired difference to standard as ``effects.effect`` reads
    it: % perplexity for loss tasks, percentage points for accuracy tasks; ``status`` its
    verdict. bind_codes is shown at its largest m and d_head = m, the width the claim says
    standard needs (``bind_point``).
    """
    rows = []
    q = QUESTIONS[question]
    for exps, design, task in q.forest():
        metric = TASK_METRIC[task]
        cmp = pooled(data, exps) if isinstance(exps, tuple) else data.compared(exps)
        c = diffs(select(cmp, design=design, task=task, metric=metric))
        if c.empty:
            continue
        if task == "bind_codes":
            c = bind_point(c)
        acc = metric == "accuracy"
        for r in c.to_dict("records"):
            ch = row_chance(r, data.profile)
            e = effect(r)  # the difference even between two guessers, drawn as such
            if e.value is None:
                continue
            status = effect(r, chance=ch).status.value
            rows.append({"panel": "accuracy" if acc else "loss", "design": design, "task": task,
                         "arm": r.get("arm", "equal"),
                         "d_head": r.get("d_head") if task == "bind_codes" else None,
                         "value": e.value, "lo": e.lo, "hi": e.hi,
                         "status": status, "unit": "points" if acc else "% perplexity"})
    df = pd.DataFrame(rows, columns=["panel", "design", "task", "arm", "d_head", "value", "lo",
                                     "hi", "status", "unit"]).astype({"d_head": "Int64"})
    order = {(d, t): i for i, (_, d, t) in enumerate(q.forest())}
    df["_o"] = [order[(d, t)] for d, t in zip(df.design, df.task)]
    arm_o = {a: i for i, a in enumerate(ARMS)}
    df["_a"] = df.arm.map(arm_o)
    return df.sort_values(["_o", "_a"]).drop(columns=["_o", "_a"]).reset_index(drop=True)


def scaling_frame(data: StudyData) -> pd.DataFrame:
    """lm_scaling's rows: design, d_model, standard's parameter count, effect (value, lo, hi:
    % perplexity vs standard at that width) and verdict status."""
    cols = ["design", "d_model", "params", "value", "lo", "hi", "status", "seeds"]
    c = diffs(data.compared("lm_scaling", metric="val_loss"))
    rows = []
    for r in c.to_dict("records"):
        e = effect(r)
        rows.append({"design": r["design"], "d_model": int(r["d_model"]),
                     "params": r.get("baseline_params"), "value": e.value, "lo": e.lo,
                     "hi": e.hi, "status": e.status.value, "seeds": r.get("n_pairs")})
    return pd.DataFrame(rows, columns=cols).sort_values(["design", "d_model"]).reset_index(
        drop=True)


def lr_frame(data: StudyData) -> pd.DataFrame:
    """lr_tune's grid with lr_tune_edge's points past its edges: task, design, arm, lr, mean val
    loss over the tuning seeds (a diverged run makes it infinite, drawn as missing), seeds, and
    whether the comparisons use that rate (``edge``: chosen at the end of the extended grid, so
    the best rate may lie beyond it)."""
    cols = ["task", "design", "arm", "lr", "val_loss", "seeds", "chosen", "edge"]
    runs = data.runs
    g = runs[runs.experiment.isin(["lr_tune", "lr_tune_edge"])] if not runs.empty else runs
    if g.empty:
        return pd.DataFrame(columns=cols)
    loss = g.val_loss if "val_loss" in g else pd.Series(float("nan"), index=g.index)
    rows = list(zip(g.task, g.design, g.arm, g.lr, g.status, loss.where(loss.notna(), None)))
    _, chosen = grid_choices(data.profile, rows)
    out = []
    for key, sub in g.assign(val_loss=loss).groupby(["task", "design", "arm", "lr"]):
        task, design, arm, lr = key
        ok = (sub.status == "done") & sub.val_loss.notna()
        grid = sorted(g[(g.task == task) & (g.design == design) & (g.arm == arm)].lr.unique())
        pick = chosen.get((task, design, arm))
        out.append({"task": task, "design": design, "arm": arm, "lr": lr,
                    "val_loss": sub.val_loss.mean() if ok.all() else float("inf"),
                    "seeds": len(sub), "chosen": pick == lr,
                    "edge": pick == lr and lr in (grid[0], grid[-1])})
    return pd.DataFrame(out, columns=cols)


def budget_gap(data: StudyData, task: str, design: str) -> dict | None:
    """A design's mean val-loss gap to standard at half and at full budget (the ``budget``
    frame, equal width): ``{half, full, half_step, steps}``; None without both rows."""
    b = data.budget
    if b.empty:
        return None
    d, s = (b[(b.task == task) & (b.design == design)],
            b[(b.task == task) & (b.design == "standard")])
    if d.empty or s.empty:
        return None
    d, s = d.iloc[0], s.iloc[0]
    return {"half": d.half - s.half, "full": d.full - s.full, "half_step": d.half_step,
            "steps": d.steps}


def edge_choices(data: StudyData, experiments: tuple[str, ...], keys: list[str]
                 ) -> pd.DataFrame:
    """The tuned rates still at an end of the rates tried: per ``keys`` (tag columns), over the
    runs of ``experiments`` (a tuning experiment and its edge's), the rate of lowest mean val
    loss (a diverged or unscored run infinite; ties to the smaller rate), kept where it is
    the smallest or largest rate tried for that key, so that the best may lie further out
    (``edges.follow_edge`` stopped at its last point). Columns ``keys`` + ``lr``."""
    runs = data.runs
    cols = [*keys, "lr"]
    if runs.empty or "experiment" not in runs or not set(cols) <= set(runs.columns):
        return pd.DataFrame(columns=cols)
    g = runs[runs.experiment.isin(experiments) & runs.status.isin(["done", "diverged"])]
    g = g.drop_duplicates(["run_id"])
    if g.empty:
        return pd.DataFrame(columns=cols)
    loss = g.val_loss if "val_loss" in g else pd.Series(float("nan"), index=g.index)
    ok = (g.status == "done") & loss.notna()
    g = g.assign(score=loss.where(ok, float("inf")).astype(float))
    out = []
    for key, sub in g.groupby(keys, sort=True):
        means = sub.groupby("lr").score.mean()
        best = min(sorted(means.index), key=lambda lr: means[lr])
        if means[best] < float("inf") and best in (means.index.min(), means.index.max()):
            out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                        "lr": float(best)})
    return pd.DataFrame(out, columns=cols)
