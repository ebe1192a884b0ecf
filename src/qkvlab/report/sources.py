"""The report's only door to the results store, the experiments and the analysis.

Everything the study reads or writes about results goes through this module, so a change in
``qkvlab.experiments`` or ``qkvlab.analysis`` is fixed here and nowhere else.

Training runs come from the named experiments (``qkvlab.experiments``). Everything the study
measures *besides* training (folding ``alt``, speed of each design, attention to a token's own
position, the pretrained-weight analysis, ...) is recorded in the same store as a "measure
run" of the experiment ``study_measures``: its spec names the measure, its inputs (run ids of
the trained models it reads) and ``MEASURE_VERSION``; its final metrics are the measured
numbers. So a re-run reuses them, and every number in the report comes from the store.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from qkvlab.experiments import registry as _registry
from qkvlab.experiments import runner as _runner
from qkvlab.experiments import stats as _stats
from qkvlab.experiments.store import DEFAULT_DB, Store, run_id

STUDY_EXPERIMENT = "study_measures"
# Bump when a measure's code changes meaning: old stored values are then recomputed.
MEASURE_VERSION = 1
GQA_EXPERIMENT = "lm_gqa"

# The experiments behind the three questions, in the order the study runs them (cheapest
# first, so a smoke study fails fast on a broken set-up).
EXPERIMENTS = ("scale_probe", "alt_vs_standard", "lm_tied_kv", GQA_EXPERIMENT, "tied_qk_qkv",
               "symmetry_emergence", "bind_vs_dhead", "kv_translate")

__all__ = ["DEFAULT_DB", "EXPERIMENTS", "STUDY_EXPERIMENT", "Store", "analyze_pretrained",
           "checkpoint_symmetry", "compare", "environment", "get_profile", "keep_files",
           "load_trained", "make_task", "mean_ci", "measure", "open_store",
           "paired", "profile_names", "run_dir", "runs", "step_metrics", "sweep",
           "task_train"]


# ---- experiments --------------------------------------------------------------------------
def _register_gqa() -> None:
    """``lm_gqa``: standard attention with n_kv_heads = n_heads/2 on ``lm``.

    Its KV cache per token equals tied K=V's (one buffer of H heads vs two of H/2), which the
    Q3 comparison "at equal cache size" needs. The baseline runs are the very runs of
    ``lm_tied_kv`` (same spec, same id), so this costs one run per seed.
    TODO(engine): move into ``qkvlab.experiments.registry`` so ``qkvlab sweep lm_gqa`` knows it.
    """
    if GQA_EXPERIMENT in _registry.EXPERIMENTS:
        return

    @_registry.experiment(GQA_EXPERIMENT, "Q3: GQA (n_kv_heads = n_heads/2), same KV cache as "
                                          "tied K=V, on lm")
    def lm_gqa(p):
        return _registry.design_arms("lm", p, {"gqa_half": {"n_kv_heads": max(1, p.n_heads // 2)}},
                                     arms=("equal",))


_register_gqa()


def profile_names() -> list[str]:
    return list(_registry.PROFILES)


def get_profile(name: str):
    """The experiments' Profile (seeds, sizes); ValueError naming the allowed profiles."""
    return _registry.get_profile(name)


def task_train(profile: str) -> dict[str, dict[str, Any]]:
    """The per-task training settings (steps, lr, batch size) of a profile."""
    return {t: dict(v) for t, v in _registry.TASK_TRAIN.get(profile, {}).items()}


def sweep(name: str, profile: str, db: str | os.PathLike, *, workers: int = 1,
          progress: bool = True) -> dict[str, int]:
    """Run (or reuse) every run of experiment ``name`` at ``profile``; counts per status."""
    return _runner.sweep(name, profile, workers=workers, db=db, progress=progress)


def open_store(db: str | os.PathLike = DEFAULT_DB) -> Store:
    return Store(db)


def runs(store: Store, experiment: str, profile: str) -> list[dict[str, Any]]:
    """Rows of ``Store.runs``: tags, status, final metrics, params, versions, hardware."""
    return store.runs(experiment, profile)


def step_metrics(store: Store, rid: str) -> dict[int, dict[str, float]]:
    """Per-step metrics of one run: ``{step: {name: value}}``."""
    out: dict[int, dict[str, float]] = {}
    for r in store.metrics(rid):
        out.setdefault(r["step"], {})[r["name"]] = r["value"]
    return out


def run_dir(store: Store, rid: str) -> Path:
    return store.runs_dir / rid


# ---- statistics (the engine's, so the report and `qkvlab results --stats` agree) -------
def compare(rows: list[dict[str, Any]], metric: str, **kw) -> list[dict[str, Any]]:
    return _stats.compare(rows, metric, **kw)


def mean_ci(values) -> dict[str, float]:
    return _stats.mean_ci(list(values))


def paired(a, b) -> dict[str, float]:
    return _stats.paired(list(a), list(b))


def environment() -> dict[str, Any]:
    """Versions, hardware and git revision, as every run records them."""
    return _runner.environment()


# ---- trained models -------------------------------------------------------------------------
def load_trained(store: Store, rid: str, file: str = "model.safetensors"):
    """The model a finished run saved (``model.safetensors`` or ``model_step<N>.safetensors``).

    Raises:
        ValueError: the file is missing (the run did not finish, or its folder was deleted).
    """
    from qkvlab.models import load_model

    path = run_dir(store, rid) / file
    if not path.is_file():
        raise ValueError(f"run {rid}: {path} is missing; re-run its experiment "
                         f"(delete the run from {store.path} if its folder was removed)")
    return load_model(path).eval()


def keep_files(store: Store, rid: str) -> dict[int, Path]:
    """``{step: path}`` of the intermediate models a run kept (``keep_at``)."""
    out = {}
    for p in run_dir(store, rid).glob("model_step*.safetensors"):
        out[int(p.stem.removeprefix("model_step"))] = p
    return dict(sorted(out.items()))


def make_task(spec: Mapping[str, Any]):
    """The prepared task of a run spec (same options, so the same data and vocabulary)."""
    from qkvlab.train import make_task as _make

    return _make(spec["task"], spec.get("task_options"))


# ---- analysis ---------------------------------------------------------------------------------
def analyze_pretrained(source: str, *, n_null: int, cka: bool) -> dict[str, Any]:
    """``qkvlab.analysis.analyze`` of a built-in model: rows per layer×head×measure, the null
    summary per role, and the published values it cites."""
    from qkvlab.analysis import analyze

    return analyze(source, None, n_null=n_null, cka=cka, figures=False, progress=False)


def published_symmetry() -> tuple[dict[str, float], str]:
    """Published symmetry scores (not measured here) and their citation."""
    from qkvlab.analysis import measures

    return dict(measures.PUBLISHED_SYMMETRY), measures.PUBLISHED_SOURCE


def checkpoint_symmetry(path: Path) -> dict[str, float]:
    """Mean symmetry score of W_QK over heads, per attention role, of a qkvlab checkpoint."""
    from qkvlab.analysis import measures
    from qkvlab.analysis.load_qkvlab import load_qkvlab

    view = load_qkvlab(path)
    by: dict[str, list[float]] = {}
    for lay in view.layers:
        by.setdefault(lay.role, []).extend(measures.symmetry_score(lay.W_Q, lay.W_K).tolist())
    return {role: sum(v) / len(v) for role, v in by.items()}


# ---- measure runs ---------------------------------------------------------------------------
def measure(store: Store, profile: str, name: str, inputs: Mapping[str, Any],
            tags: Mapping[str, Any], fn: Callable[[], Mapping[str, float]]) -> dict[str, float]:
    """The stored result of measure ``name`` on ``inputs``, computing it with ``fn`` if absent.

    ``inputs`` must hold everything the result depends on (run ids, sizes); with
    ``MEASURE_VERSION`` they are hashed into the run id, so an unchanged measure is reused.

    Raises:
        ValueError: ``fn`` failed (its traceback is kept in the store) or returned a non-number.
    """
    spec = {"measure": name, "measure_version": MEASURE_VERSION, "profile": profile,
            "inputs": dict(inputs)}
    rid = run_id(spec)
    store.add(STUDY_EXPERIMENT, profile, [(spec, {"measure": name, **tags})])
    if store.status(rid) == "done":
        return _final(store, rid)
    if not store.claim(rid):  # a stale 'running' row from a killed study: take it back
        store.reclaim()
        if not store.claim(rid):
            raise ValueError(f"measure {name}: run {rid} is held by another live study")
    try:
        final = {k: float(v) for k, v in fn().items()}
    except Exception as e:
        store.fail(rid, traceback.format_exc())
        raise ValueError(f"measure {name} failed: {type(e).__name__}: {e}") from e
    bad = [k for k, v in final.items() if not math.isfinite(v)]
    env = environment()
    store.finish(rid, "done", 0, {k: v for k, v in final.items() if k not in bad},
                 {"versions": env["versions"], "hardware": env["hardware"],
                  "git_rev": env["git_rev"]})
    return _final(store, rid)


def _final(store: Store, rid: str) -> dict[str, float]:
    rows = store.conn.execute("SELECT name, value FROM final WHERE run_id=?", (rid,)).fetchall()
    return {r["name"]: r["value"] for r in rows}

