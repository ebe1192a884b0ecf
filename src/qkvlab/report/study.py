"""``qkvlab study``: run (or reuse) everything behind the three questions, then write the report.

Steps, each reused from the results store when already done:
    1. the named experiments (``sources.EXPERIMENTS``), swept at the profile;
    2. the measures on the trained models and on the designs (``measures``), recorded in the
       store as runs of ``study_measures``;
    3. the pretrained-weight analysis of MiniLM, Whisper tiny and SmolLM2;
then ``collect`` reads it all back from the store and the figures, verdicts, HTML and Markdown
are written to ``<out>/<profile>/``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from qkvlab.report import measures as M
from qkvlab.report import sources as S

PRETRAINED = ("minilm", "whisper-tiny", "smollm2")

# Sizes of the measures per profile: evaluation batch, speed-benchmark rounds, decode length,
# null sample size of the pretrained analysis and whether it runs the models on text (CKA).
MEASURE_SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"batch": 8, "rounds": 3, "decode_tokens": 16, "n_null": 32, "cka": False},
    "quick": {"batch": 16, "rounds": 5, "decode_tokens": 48, "n_null": 128, "cka": True},
    "full": {"batch": 32, "rounds": 7, "decode_tokens": 128, "n_null": 256, "cka": True},
}
# Designs compared by speed and cache size: labels as in the experiments' tags.
SPEED_VARIANTS = {"alt": {"design": "alt"}, "tied_qk": {"design": "tied_qk"},
                  "tied_qk_selfmask": {"design": "tied_qk", "self_mask": True},
                  "tied_qkv": {"design": "tied_qkv"}, "tied_kv": {"design": "tied_kv"}}


@dataclass
class StudyConfig:
    """What ``qkvlab study`` does. ``out`` is the reports root; the report goes to out/profile."""

    profile: str = "quick"
    db: str = str(S.DEFAULT_DB)
    out: str = "reports"
    workers: int = 1
    progress: bool = True
    pretrained: tuple[str, ...] = PRETRAINED
    log: Callable[[str], None] = field(default=print, repr=False)

    def __post_init__(self) -> None:
        S.get_profile(self.profile)  # ValueError naming the allowed profiles
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers: {self.workers!r} must be a positive integer")
        bad = sorted(set(self.pretrained) - set(PRETRAINED))
        if bad:
            raise ValueError(f"pretrained: {bad[0]!r} is not one of {list(PRETRAINED)}")

    @property
    def report_dir(self) -> Path:
        return Path(self.out) / self.profile


def run_study(cfg: StudyConfig) -> Path:
    """Run the study and write the report; returns the path of ``index.html``."""
    from qkvlab.report import collect, render

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    counts: dict[str, dict[str, int]] = {}
    steps = list(S.EXPERIMENTS) + ["measures", "pretrained"]
    bar = tqdm(steps, desc=f"study [{cfg.profile}]", disable=not cfg.progress, unit="step",
               dynamic_ncols=True)
    with S.open_store(cfg.db) as store:
        rec = Recorder(store, cfg.profile)
        for step in bar:
            bar.set_postfix_str(step)
            t = time.perf_counter()
            if step == "measures":
                run_measures(rec, cfg)
            elif step == "pretrained":
                run_pretrained(rec, cfg)
            else:
                counts[step] = S.sweep(step, cfg.profile, cfg.db, workers=cfg.workers,
                                       progress=cfg.progress)
                if counts[step].get("failed"):
                    rec.notes.append(f"{step}: {counts[step]['failed']} run(s) failed; see "
                                 f"`qkvlab results {step} --profile {cfg.profile}`")
            timings[step] = time.perf_counter() - t
        bar.close()
        data = collect.collect(store, cfg.profile, rec.results)
    data["meta"].update(total_s=time.perf_counter() - t0, step_s=timings, counts=counts,
                        notes=rec.notes, db=str(cfg.db), workers=cfg.workers)
    index = render.write_report(data, cfg.report_dir)
    cfg.log(f"study [{cfg.profile}] done in {time.perf_counter() - t0:.0f} s: {index}")
    return index


# ---- measures on trained models -------------------------------------------------------------
class Recorder:
    """Runs measures through the store (``sources.measure``) and keeps what it read back.

    ``results[name]`` is a list of ``{**tags, **stored metrics}``; a measure that cannot run
    (a missing trained model, a weights package not installed) becomes a note, not a crash.
    """

    def __init__(self, store, profile: str):
        self.store, self.profile = store, profile
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.notes: list[str] = []

    def __call__(self, name: str, inputs: dict, tags: dict, fn: Callable[[], dict]) -> None:
        try:
            final = S.measure(self.store, self.profile, name, inputs, tags, fn)
        except ValueError as e:
            self.notes.append(f"{name} {tags}: {e}")
            return
        self.results.setdefault(name, []).append({**tags, **final})


def _select(rows: list[dict], **tags) -> dict[int, dict]:
    """Finished runs whose tags match, by seed."""
    return {r["tags"]["seed"]: r for r in rows if r["status"] == "done"
            and all(r["tags"].get(k) == v for k, v in tags.items())}


def run_measures(rec: Recorder, cfg: StudyConfig) -> None:
    """Every measure of ``measures`` the report needs, recorded through ``rec``."""
    store, p, size = rec.store, S.get_profile(cfg.profile), MEASURE_SIZES[cfg.profile]
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    def on_model(name: str, row: dict, tags: dict, fn) -> None:
        def run():
            task = S.make_task(row["spec"])
            idx = M.first_batch(task, "val", size["batch"])["idx"]
            return fn(S.load_trained(store, row["id"]), idx)
        rec(name, {"run": row["id"], "batch": size["batch"]}, tags, run)

    alt_rows = S.runs(store, "alt_vs_standard", cfg.profile)
    for seed, row in _select(alt_rows, task="lm", arm="equal", design="alt").items():
        on_model("fold_alt", row, {"design": "alt", "seed": seed},
                 lambda m, idx: M.fold_check(m, idx, size["rounds"]))
    for design in ("standard", "alt"):
        for seed, row in _select(alt_rows, task="lm", arm="equal", design=design).items():
            on_model("convex_range", row, {"design": design, "seed": seed}, M.convex_range)

    qk_rows = S.runs(store, "tied_qk_qkv", cfg.profile)
    for design in ("standard", "tied_qk", "tied_qk_selfmask", "tied_qkv"):
        for task in ("lm", "relation"):
            for seed, row in _select(qk_rows, task=task, arm="equal", design=design).items():
                on_model("own_position", row, {"design": design, "task": task, "seed": seed},
                         M.own_position_weight)

    for row in S.runs(store, "symmetry_emergence", cfg.profile):
        if row["status"] != "done":
            continue

        def sym(row=row) -> dict[str, float]:
            out = {}
            for step, path in S.keep_files(store, row["id"]).items():
                for role, s in S.checkpoint_symmetry(path).items():
                    out[f"{role}/step{step}"] = s
            if not out:
                raise ValueError(f"run {row['id']} kept no intermediate models")
            return out
        rec("symmetry_steps", {"run": row["id"]},
            {"kind": row["tags"]["kind"], "seed": row["tags"]["seed"]}, sym)

    seq = _lm_seq_len(alt_rows)
    dims = {"d_model": p.d_model, "n_heads": p.n_heads}
    variants = {**SPEED_VARIANTS, "gqa_half": {"n_kv_heads": max(1, p.n_heads // 2)}}
    rec("attention_speed", {**dims, "T": seq, "B": p.batch_size, "rounds": size["rounds"],
                            "variants": variants}, {},
        lambda: M.attention_speed(p.d_model, p.n_heads, seq, p.batch_size, variants,
                                  rounds=size["rounds"]))
    dec = {"standard": {}, **{k: v for k, v in variants.items() if k != "tied_qk_selfmask"}}
    n_ctx = 8 + size["decode_tokens"]
    rec("decode_speed", {**dims, "n_layers": p.n_layers, "n_ctx": n_ctx,
                         "new": size["decode_tokens"], "variants": dec, "rounds": size["rounds"]},
        {}, lambda: M.decode_speed(M.variant_configs(p.d_model, p.n_layers, p.n_heads, n_ctx, dec),
                                   size["decode_tokens"], size["rounds"]))


def _lm_seq_len(rows: list[dict]) -> int:
    """The ``lm`` context length of this profile, read from a stored spec."""
    for r in rows:
        if r["tags"].get("task") == "lm":
            return int(r["spec"]["task_options"].get("seq_len", 64))
    return 64


def run_pretrained(rec: Recorder, cfg: StudyConfig) -> None:
    """Symmetry and subspace overlaps of the built-in pretrained models, against the null."""
    size = MEASURE_SIZES[cfg.profile]
    for source in cfg.pretrained:
        def fn(source=source) -> dict[str, float]:
            res = S.analyze_pretrained(source, n_null=size["n_null"], cka=size["cka"])
            out: dict[str, float] = {}
            for r in res["summary"]:
                for k in ("mean", "std", "null_mean", "null_std", "null_lo", "null_hi",
                          "share_above_null", "n_heads"):
                    out[f"summary/{r['role']}/{r['measure']}/{k}"] = r[k]
            per: dict[tuple, list[float]] = {}
            for r in res["rows"]:
                per.setdefault((r["name"], r["measure"]), []).append(r["value"])
            for (name, measure), v in per.items():
                out[f"layer/{name}/{measure}"] = sum(v) / len(v)
            return out
        rec("pretrained", {"source": source, "n_null": size["n_null"], "cka": size["cka"]},
            {"source": source}, fn)
