"""Read the study's results back from the store into one plain dict the report is drawn from.

``collect(store, profile, measured)`` returns::

    {"meta": {...},                 profile, sizes, seeds, versions, hardware, git revision
     "q1": {...}, "q2": {...}, "q3": {...},   per question: comparison rows and measures
     "summary": [...]}              one row per design, relative to standard

Comparison rows are ``stats.compare`` rows (mean ± 95% CI over seeds, paired difference vs
standard). Nothing here is typed in: every value is a stored result or derived from them.
"""

from __future__ import annotations

import platform
from typing import Any

from qkvlab.report import sources as S

# task -> (metric, lower is better). Real-text tasks are judged on val loss, synthetic ones
# on accuracy at the queried positions (chance-level loss says little there).
TASK_METRIC = {"lm": ("val_loss", True), "mlm": ("val_loss", True),
               "translate": ("val_loss", True), "mqar": ("accuracy", False),
               "relation": ("accuracy", False), "bind": ("accuracy", False)}
PROBE_STATS = ("norm_entropy", "saturated", "grad_WQ", "grad_WK")


def with_run_fields(rows: list[dict], fields=("tokens_per_s",)) -> list[dict]:
    """Copies of store rows whose ``final`` also holds run columns (so ``compare`` sees them)."""
    out = []
    for r in rows:
        extra = {k: r[k] for k in fields if r.get(k) is not None}
        params = r.get("params") or {}
        if "attention" in params:
            extra["params_attention"] = params["attention"]
        out.append({**r, "final": {**r["final"], **extra}})
    return out


def compare_tasks(rows: list[dict], tasks=None, metrics=None) -> list[dict]:
    """``compare`` rows for each task's metric (and any extra ``metrics``), tagged ``metric``."""
    out = []
    rows = with_run_fields(rows)
    tasks = tasks or sorted({r["tags"].get("task") for r in rows if r["tags"].get("task")})
    for task in tasks:
        sub = [r for r in rows if r["tags"].get("task") == task]
        names = [TASK_METRIC.get(task, ("val_loss", True))[0], *(metrics or [])]
        for metric in dict.fromkeys(names):
            for c in S.compare(sub, metric):
                if c["n"]:
                    out.append({**c, "metric": metric})
    return out


def probe_rows(store, rows: list[dict]) -> list[dict]:
    """Scale-probe statistics per run and probed step: scale, d_head, seed, step, stat, value."""
    out = []
    for r in rows:
        if r["status"] != "done":
            continue
        t = r["tags"]
        for step, m in S.step_metrics(store, r["id"]).items():
            for stat in PROBE_STATS:
                if f"probe/{stat}" in m:
                    out.append({"scale": t["scale"], "d_head": t["d_head"], "seed": t["seed"],
                                "step": step, "stat": stat, "value": m[f"probe/{stat}"]})
        if "val_loss" in r["final"]:
            out.append({"scale": t["scale"], "d_head": t["d_head"], "seed": t["seed"],
                        "step": r["step"], "stat": "val_loss", "value": r["final"]["val_loss"]})
    return out


def environment(profile: str) -> dict[str, Any]:
    """Profile sizes and seeds, library versions and hardware of this machine."""
    import matplotlib
    import pandas

    p = S.get_profile(profile)
    env = S.environment()
    versions = {**env["versions"], "matplotlib": matplotlib.__version__,
                "pandas": pandas.__version__}
    hw = {**env["hardware"], "cpu_model": _cpu_model()}
    return {"profile": profile, "seeds": list(p.seeds), "probe_seeds": list(p.probe_seeds),
            "sizes": {"d_model": p.d_model, "n_layers": p.n_layers, "n_heads": p.n_heads,
                      "batch_size": p.batch_size, "steps": p.steps, "lr": p.lr,
                      "eval_batches": p.eval_batches},
            "task_train": S.task_train(profile),
            "versions": versions, "hardware": hw, "git_rev": env["git_rev"],
            "platform": platform.platform()}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect(store, profile: str, measured: dict[str, list[dict]]) -> dict[str, Any]:
    """Everything the report shows, from the store (see the module docstring)."""
    R = {name: S.runs(store, name, profile) for name in S.EXPERIMENTS}
    one = lambda name: (measured.get(name) or [{}])[0]
    speed, decode = one("attention_speed"), one("decode_speed")
    q1 = {"loss": compare_tasks(R["alt_vs_standard"], metrics=["tokens_per_s"]),
          "chrf": [c for c in compare_tasks(R["alt_vs_standard"], ["translate"], ["chrf"])
                   if c["metric"] == "chrf"],
          "fold": measured.get("fold_alt", []), "convex": measured.get("convex_range", []),
          "probe": probe_rows(store, R["scale_probe"])}
    published, cite = S.published_symmetry()
    q2 = {"tasks": compare_tasks(R["tied_qk_qkv"], metrics=["tokens_per_s"]),
          "own": measured.get("own_position", []), "pretrained": measured.get("pretrained", []),
          "published": published, "published_source": cite,
          "emergence": measured.get("symmetry_steps", [])}
    lm_kv = R["lm_tied_kv"] + [r for r in R["lm_gqa"] if r["tags"]["design"] != "standard"]
    q3 = {"bind": compare_tasks(R["bind_vs_dhead"]),
          "translate": compare_tasks(R["kv_translate"], metrics=["chrf"]),
          "lm": compare_tasks(lm_kv, metrics=["tokens_per_s"]),
          "decode": decode, "speed": speed}
    data = {"meta": environment(profile), "q1": q1, "q2": q2, "q3": q3}
    data["summary"] = summary(data, R)
    return data


def summary(data: dict, R: dict[str, list[dict]]) -> list[dict]:
    """One row per design: attention parameters, speed and quality relative to ``standard``.

    Quality is the equal-width arm: per task, the paired difference of the task's metric
    (``rel_pct`` ± ``rel_half`` for losses, ``diff`` in points for accuracies).
    """
    rows: dict[str, dict] = {}
    comps = data["q1"]["loss"] + data["q2"]["tasks"] + data["q3"]["lm"] + data["q3"]["translate"]
    bind = data["q3"]["bind"]
    if bind:  # bind: the widest d_head tried, where a capacity gap should have closed
        widest = max(c.get("d_head", 0) for c in bind)
        comps += [{**c, "task": f"bind (d_head {widest})"} for c in bind
                  if c.get("d_head") == widest]
    for c in comps:
        if c["design"] == "standard" or c.get("arm") != "equal" or "diff" not in c:
            continue
        task = c["task"]
        metric, lower = TASK_METRIC.get(task.split(" ")[0], ("val_loss", True))
        row = rows.setdefault(c["design"], {"design": c["design"], "quality": {}})
        if c["metric"] == "tokens_per_s":
            row.setdefault("train_speed", {})[task] = c
        elif c["metric"] == metric:
            row["quality"][task] = {**c, "lower_is_better": lower}
            if c.get("n_params") and c.get("baseline_params"):
                row.setdefault("params_ratio", c["n_params"] / c["baseline_params"])
    attn_params = _attention_params(R)
    speed, decode = data["q3"]["speed"], data["q3"]["decode"]
    base_cache = decode.get("standard/cache_bytes_per_token")
    base_dec = decode.get("standard/decode_tokens_per_s")
    for d, row in rows.items():
        row["attention_params_ratio"] = attn_params.get(d)
        row["layer_time_ratio"] = speed.get(f"{d}/time_vs_standard")
        cache = decode.get(f"{d}/cache_bytes_per_token")
        row["cache_ratio"] = cache / base_cache if cache and base_cache else None
        dec = decode.get(f"{d}/decode_tokens_per_s")
        row["decode_ratio"] = dec / base_dec if dec and base_dec else None
    return [rows[d] for d in sorted(rows)]


def _attention_params(R: dict[str, list[dict]]) -> dict[str, float]:
    """Attention parameters of each design / standard's, equal arm, same task and seed."""
    out: dict[str, float] = {}
    for rows in R.values():
        base = {(r["tags"].get("task"), r["tags"].get("seed"), r["tags"].get("d_head")): r
                for r in rows if r["tags"].get("design") == "standard"}
        for r in rows:
            t = r["tags"]
            b = base.get((t.get("task"), t.get("seed"), t.get("d_head")))
            if t.get("arm") != "equal" or t.get("design") in (None, "standard") or b is None:
                continue
            pa, pb = (r.get("params") or {}).get("attention"), (b.get("params") or {}).get("attention")
            if pa and pb:
                out.setdefault(t["design"], pa / pb)
    return out
