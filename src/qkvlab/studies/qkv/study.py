"""``qkvlab study``: run (or reuse) everything behind the three questions, then write the report.

The study's steps (``run_study``), each reused from the results store when already done: the
planned experiments swept at the profile as one queue, the measures on the trained models and
on the designs, the pretrained-weight analysis of the profile's zoo models, and the tie costs
of its trained decoders; then ``compute.results.load`` reads it all back from the store and
``render.page.write_report`` writes the figures, verdicts, HTML and Markdown to
``<out>/<profile>/``. This module joins the three layers: it is the only one that imports
``plan``, ``compute`` and ``render`` alike.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from qkvlab.analysis.run import SUMMARY_VERSION
from qkvlab.analysis.zoo import load_manifest
from qkvlab.env import cpu_model, environment
from qkvlab.experiments.frames import runs_frame
from qkvlab.experiments.registry import ResultsPending, get_profile
from qkvlab.experiments.runner import failure_report, status_counts, sweep, sweep_ids
from qkvlab.experiments.store import DEFAULT_DB, Store
from qkvlab.experiments.timing import sum_parts
from qkvlab.hf.convert import convert
from qkvlab.hf.cost import measure_tie_cost
from qkvlab.hf.tie import KINDS
from qkvlab.models import load_model
from qkvlab.progress import bar as progress_bar
from qkvlab.studies.qkv.compute import measures as M
from qkvlab.studies.qkv.compute.measures import MEASURE_VERSION
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute import scaling as S
from qkvlab.studies.qkv.compute import backtest as BT
from qkvlab.studies.qkv.plan.experiments import ORDER
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.questions import QUESTIONS, tuned_designs
from qkvlab.studies.qkv.plan.vocab import CONTROL, DESIGNS
from qkvlab.studies.qkv.render import page
from qkvlab.train import RunSpec, make_task

ZOO = load_manifest()  # every pretrained model the study can analyse, by name
# The quick profile's: the zoo models `make` installs (manifest profile "quick"); every other
# profile analyses the whole zoo, a model not fetched becoming a note naming `qkvlab zoo fetch`.
PRETRAINED = tuple(n for n, m in ZOO.items() if m.profile == "quick")


@dataclass
class StudyConfig:
    """What ``qkvlab study`` does. ``out`` is the reports root; the report goes to out/profile."""

    profile: str = "quick"
    db: str = str(DEFAULT_DB)
    out: str = "reports"
    workers: int = 1
    progress: bool = True
    pretrained: tuple[str, ...] | None = None  # None: the profile's (see ``pretrained_for``)
    log: Callable[[str], None] = field(default=print, repr=False)

    def __post_init__(self) -> None:
        get_profile(self.profile)  # ValueError naming the allowed profiles
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ValueError(f"workers: {self.workers!r} must be a positive integer")
        if self.pretrained is None:
            self.pretrained = pretrained_for(self.profile)
        bad = sorted(set(self.pretrained) - set(ZOO))
        if bad:
            raise ValueError(f"pretrained: {bad[0]!r} is not one of {list(ZOO)}")

    @property
    def report_dir(self) -> Path:
        return Path(self.out) / self.profile


def pretrained_for(profile: str) -> tuple[str, ...]:
    """The pretrained models a profile analyses: quick (and smoke) the installed few, the larger
    profiles the whole zoo; none at scaling and kv (trained lm only) and convert (the
    conversions only: `make report` fetches no zoo for them, so every model not installed
    would fail)."""
    if profile in ("scaling", "convert", "kv"):
        return ()
    return PRETRAINED if profile in ("quick", "smoke") else tuple(ZOO)


class Recorder:
    """Runs measures through the store; one that cannot run (a missing trained model, a weights
    package not installed) becomes a note in the report, not a crash."""

    def __init__(self, store: Store, profile: str):
        self.store, self.profile, self.notes = store, profile, []
        self.env = environment()

    def __call__(self, name: str, spec: dict, fn: Callable[[], Any],
                 run: str | None = None) -> None:
        full = {**spec, "profile": self.profile, "version": MEASURE_VERSION}
        try:
            self.store.measure(name, full, fn, run=run, env=self.env)
        except ValueError as e:
            self.notes.append(f"{name} ({run or spec}): {e}")


def run_study(cfg: StudyConfig) -> Path:
    """Run the study and write the report; returns the path of ``index.html``."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    counts: dict[str, dict[str, int]] = {}
    trained: dict[str, dict[str, float]] = {}  # run id -> its timings, runs trained here
    steps = ["experiments", "measures", "pretrained", "tie_cost", "convert"]
    bar = progress_bar(steps, desc=f"study [{cfg.profile}]", disable=not cfg.progress,
                       unit="step", dynamic_ncols=True)
    with Store(cfg.db) as store:
        rec = Recorder(store, cfg.profile)
        for step in bar:
            bar.set_postfix_str(step)
            t = time.perf_counter()
            if step == "measures":
                run_measures(rec, cfg)
            elif step == "pretrained":
                run_pretrained(rec, cfg)
            elif step == "tie_cost":
                run_tie_cost(rec, cfg)
            elif step == "convert":
                run_convert(rec, cfg)
            else:
                trained, counts = run_experiments(rec, cfg)
            timings[step] = time.perf_counter() - t
        bar.close()
        sweep_s = timings["experiments"]
        time_split = {"runs": len(trained), "wall_s": sweep_s, "workers": cfg.workers,
                      "parts": sum_parts(trained.values(), wall_s=sweep_s, workers=cfg.workers)}
        meta = {"total_s": time.perf_counter() - t0, "step_s": timings, "counts": counts,
                "sweep_time": time_split,
                "notes": rec.notes, "db": str(cfg.db), "workers": cfg.workers,
                "environment": environment()}
        data = results.load(store, cfg.profile, meta)
    index = page.write_report(data, cfg.report_dir)
    cfg.log(f"study [{cfg.profile}] done in {time.perf_counter() - t0:.0f} s: {index}")
    return index


def run_experiments(rec: Recorder, cfg: StudyConfig
                    ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    """Sweep every experiment of ``ORDER`` as one queue (the rate-tuned comparisons in a second
    stage, once ``lr_tune`` has chosen); failed runs become notes.

    Returns:
        the timings of the runs trained here, by run id, and each experiment's run counts
        per status.
    """
    store, began = rec.store, time.time()
    try:
        sweep(list(ORDER), cfg.profile, db=cfg.db, workers=cfg.workers, progress=cfg.progress,
              log=cfg.log)
    except ResultsPending as e:  # what they need failed: its failures are noted below
        rec.notes.append(f"experiments not run: {e}")
        cfg.log(f"study: {e}")
    counts: dict[str, dict[str, int]] = {}
    trained: dict[str, dict[str, float]] = {}
    for name in ORDER:
        try:
            ids = sweep_ids(name, cfg.profile, store)
        except ResultsPending:
            continue
        trained.update(store.timings(ids, since=began))
        counts[name] = status_counts(store, ids)
        if counts[name].get("failed"):
            why = failure_report(store, name, cfg.profile)
            rec.notes.append(f"{name}: {counts[name]['failed']} run(s) failed; {why}")
            cfg.log(f"study: {name}: {counts[name]['failed']} run(s) failed\n{why}")
    return trained, counts


# ---- measures on trained models -------------------------------------------------------------
def _done(runs: pd.DataFrame, **tags) -> pd.DataFrame:
    """Finished runs whose tags match, one row per run."""
    df = results.select(runs[runs.status == "done"], **tags)
    return df.drop_duplicates("run_id")


def run_measures(rec: Recorder, cfg: StudyConfig) -> None:
    """Every measure the report needs, recorded through ``rec``."""
    store, p = rec.store, get_profile(cfg.profile)
    assert isinstance(p, QKVProfile)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    runs = {e: runs_frame(store, e, cfg.profile) for e in ORDER}

    def on_model(name: str, row, fn) -> None:
        def compute():
            spec = RunSpec.from_dict(store.runs_spec(row.run_id))
            idx = M.first_batch(make_task(spec.task, spec.task_options), "val",
                                p.measure_batch)["idx"]
            path = store.runs_dir / row.run_id / "model.safetensors"
            if not path.is_file():
                raise ValueError(f"{path} is missing; re-run experiment {row.experiment}")
            return fn(load_model(path).eval(), idx)
        rec(name, {"run": row.run_id, "batch": p.measure_batch}, compute, run=row.run_id)

    alt = runs["alt_vs_standard"]
    if not alt.empty:
        for row in _done(alt, task="lm", arm="equal", design="alt").itertuples():
            on_model("fold_alt", row, lambda m, idx: M.fold_check(m, idx, p.rounds))
        for design in ("standard", "alt"):
            for row in _done(alt, task="lm", arm="equal", design=design).itertuples():
                on_model("convex_range", row, M.convex_range)
    qk = runs["tied_qk_qkv"]
    if not qk.empty:
        for design in ("standard", *QUESTIONS["q2"].designs("tied_qk_qkv")):
            for task in ("lm", "relation"):
                for row in _done(qk, task=task, arm="equal", design=design).itertuples():
                    on_model("own_position", row, M.own_position_weight)
        for task in ("lm", "mlm"):  # how alike W_Q, W_K, W_V become when nothing ties them
            for row in _done(qk, task=task, arm="equal", design="standard").itertuples():
                path = store.runs_dir / row.run_id / "model.safetensors"
                rec("weight_similarity", {"run": row.run_id, "n_null": p.n_null},
                    lambda path=path: M.weight_similarity(path, p.n_null), run=row.run_id)
    sym = runs["symmetry_emergence"]
    if not sym.empty:
        for row in _done(sym).itertuples():
            folder = store.runs_dir / row.run_id
            files = {int(f.stem.removeprefix("model_step")): f
                     for f in sorted(folder.glob("model_step*.safetensors"))}
            rec("symmetry_steps", {"run": row.run_id},
                lambda files=files: M.symmetry_steps(dict(sorted(files.items()))), run=row.run_id)

    seq = int(p.task_options.get("lm", {}).get("seq_len", 64))
    dims = {"d_model": p.d_model, "n_heads": p.n_heads}
    # every design the questions compare on lm; decode once per cache (a self-mask is
    # its unmasked design's cache and step)
    variants = {d: DESIGNS[d].model_options(p) for d in tuned_designs()["lm"] if d != CONTROL}
    rec("attention_speed", {**dims, "T": seq, "B": p.batch_size, "rounds": p.rounds,
                            "variants": variants},
        lambda: M.attention_speed(p.d_model, p.n_heads, seq, p.batch_size, variants,
                                  rounds=p.rounds))
    dec = {"standard": {}, **{k: v for k, v in variants.items() if not v.get("self_mask")}}
    n_ctx = 8 + p.decode_tokens
    rec("decode_speed", {**dims, "n_layers": p.n_layers, "n_ctx": n_ctx, "new": p.decode_tokens,
                         "variants": dec, "rounds": p.rounds},
        lambda: M.decode_speed(M.variant_configs(p.d_model, p.n_layers, p.n_heads, n_ctx, dec),
                               p.decode_tokens, p.rounds))
    record_prediction(rec, cfg, runs)
    if p.kv_contexts:
        # order: both orders alike, own_sdpa, the probe rounding down (9bbf83b): a new record;
        # cpu_model: the machine, whose `qkvlab bench --only kv` rows the report prefers
        rec("kv_decode", {"contexts": list(p.kv_contexts), "batches": list(p.kv_batches),
                          "rounds": p.rounds, "d_model": 512, "n_heads": 8, "n_layers": 1,
                          "order": "alternating", "cpu_model": cpu_model()},
            lambda: M.kv_decode(p.kv_contexts, p.kv_batches, p.rounds))


def record_prediction(rec: Recorder, cfg: StudyConfig, runs: dict[str, pd.DataFrame]) -> None:
    """Store the size fit's prediction at the published sizes (``compute.scaling``) and the size
    trend's back-test (``compute.backtest``) before the report is drawn: the comparison with the
    published numbers reads only the back-test's record, the predictions of the forms that
    passed it. Each spec names every size run it read, with its status, so new runs make a new
    record."""
    size = runs.get(S.RUN_EXPERIMENTS["size"], pd.DataFrame())
    if size.empty:
        return
    both = pd.concat([runs[e] for e in S.RUN_EXPERIMENTS.values()], ignore_index=True)
    chance = results.chance(S.TASK, get_profile(cfg.profile))
    read = sorted(f"{r.run_id}:{r.status}" for r in size.drop_duplicates("run_id").itertuples())
    rec(S.PREDICTION, {"runs": read, "chance": chance},
        lambda: S.prediction_records(both, chance))
    # the trend's back-test (``compute.backtest``): only a form that passes is extrapolated
    rec(BT.MEASURE, {"runs": read, "chance": chance, "boot": BT.BOOT, "holdout": BT.HOLDOUT},
        lambda: BT.backtest(both, chance))


def run_pretrained(rec: Recorder, cfg: StudyConfig) -> None:
    """Symmetry and subspace overlaps of the profile's pretrained models, against the null."""
    p = get_profile(cfg.profile)
    for source in cfg.pretrained:
        # SUMMARY_VERSION: records stored before symmetry_layer_median are recomputed, and
        # only these (MEASURE_VERSION would re-time every speed measure too)
        rec("pretrained", {"source": source, "n_null": p.n_null, "cka": p.cka,
                           "summary_version": SUMMARY_VERSION},
            lambda source=source: M.pretrained(source, p.n_null, p.cka))


def run_tie_cost(rec: Recorder, cfg: StudyConfig) -> None:
    """Held-out perplexity of the profile's pretrained decoders with each tie imposed
    (``qkvlab.hf.cost``; stored as measures ``tie_cost`` and ``tie_fit``). A model not fetched
    becomes a note naming ``qkvlab zoo fetch``."""
    p = get_profile(cfg.profile)
    assert isinstance(p, QKVProfile)
    if p.tie_cost is None:
        return
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in p.tie_cost_models:
        try:
            layers = p.tie_cost_per_layer if name in (p.tie_cost_per_layer_models
                                                      or p.tie_cost_models) else ()
            measure_tie_cost(rec.store, name, KINDS, p.tie_cost, layers, env=rec.env,
                             log=cfg.log)
        except ValueError as e:  # ZooError: not fetched or a file that fails its sha256
            rec.notes.append(f"tie_cost ({name}): {e}")


def run_convert(rec: Recorder, cfg: StudyConfig) -> None:
    """The profile's pretrained decoders converted to each tie and uptrained
    (``qkvlab.hf.convert``; measures ``convert`` and ``convert_teacher``, shared with
    ``qkvlab convert``, so a curve stored by the command is not trained again). With the
    profile's ``convert_lr_grid`` the first config chooses its rate on val (``--lr-grid``;
    with ``convert_o_bases`` its W_O basis too) and every other config of that model trains at
    the chosen rate: the starts are compared, and the untied baseline uptrained, the same way."""
    p = get_profile(cfg.profile)
    assert isinstance(p, QKVProfile)
    if not p.convert:
        return
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from qkvlab.hf import cost
    for name in p.convert_models:
        once: dict = {}  # one load per model, and none when every conversion is stored

        def load(name=name):
            return once.get("m") or once.setdefault("m", cost.load_lm(name))
        rate = None  # with a grid: chosen on val by the first config, then every config's
        for i, c in enumerate(p.convert):
            if rate is not None:
                c = dataclasses.replace(c, uptrain=dataclasses.replace(c.uptrain, lr=rate))
            try:
                recs = convert(rec.store, name, c, log=cfg.log, progress=cfg.progress,
                               loaded=load, lr_grid=p.convert_lr_grid if i == 0 else None,
                               o_bases=p.convert_o_bases if i == 0 else ())
            except ValueError as e:  # not fetched, a tie the model refuses, a text too short
                rec.notes.append(f"convert ({name} {c.tie}/{c.start}): {e}")
                if i == 0 and p.convert_lr_grid:  # no rate chosen: the others cannot run at it
                    rec.notes.append(f"convert ({name}): no rate chosen on val, so no other "
                                     f"conversion of it ran")
                    break
                continue
            if i == 0 and p.convert_lr_grid:
                rate = recs[0]["lr"]
