"""The study's results, read back from the store as tidy DataFrames (``StudyData``).

Nothing here is typed in: every value is a stored run, a stored measure, or a statistic of them.
Figures, verdicts and the page select columns of these frames; none of them parses a key.

``StudyData`` holds:
    runs         ``qkvlab.experiments.frames.runs_frame`` of the study's experiments
    comparisons  one row per (experiment, task, arm, d_head, design, metric): mean ± 95% CI over
                 seeds and the paired difference to ``standard`` on the test split
                 (``vocab.reported``: ``metric`` names the metric, its values are the runs'
                 ``test_<metric>``; ``stats.compare`` columns; a diverged or failed run, or a
                 finished one without a test score, enters at its task's chance level or the
                 worst finished value, whichever is worse), whether standard beats the
                 attention-free control there (``mark_control``: attention_used,
                 control_value, control_half) and each headline family's correction
                 (``multiplicity.correct``: family, family_m, p_decided, p_adj)
    probe        the scale probe's statistics: scale, d_head, seed, step, stat, value (its
                 ``val_loss`` stat: each run's final loss on the test split)
    measures     per measure name, its records joined with the tags of the run it read
                 (design, task, seed, ...), see ``measures.py`` for each one's columns
    published    published symmetry values (reference only) and their citation
    budget       val loss at half and full training budget per real-text task and design
                 (the per-step history: the val split)
    meta         profile, sizes, hardware, versions, timings and notes
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from qkvlab.analysis.run import SUMMARY_VERSION
from qkvlab.analysis.measures import PUBLISHED_SOURCE, PUBLISHED_SYMMETRY
from qkvlab.data import MissingSourceError, get_task
from qkvlab.experiments.frames import measures_frame, metrics_frame, runs_frame
from qkvlab.experiments.registry import get_profile
from qkvlab.experiments.store import Store
from qkvlab.stats import compare_frame
from qkvlab.studies.qkv.compute.effects import attention_used, effect
from qkvlab.studies.qkv.compute.measures import MEASURE_VERSION
from qkvlab.studies.qkv.compute.multiplicity import correct
from qkvlab.studies.qkv.plan.experiments import BY_NAME, ORDER
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.vocab import (
    CONTROL,
    TASK_METRIC,
    lower_is_better,
    metric_of,
    reported,
)

# tags that tell comparisons apart (besides design, seed); init: scale_train's placements are
# compared with inside from the same initialization
GROUP_BY = ("task", "arm", "m", "d_head", "d_model", "init")
PROBE_STATS = ("norm_entropy", "saturated", "grad_WQ", "grad_WK")
RUN_TAGS = ("experiment", "design", "task", "arm", "seed", "kind")


@dataclass
class StudyData:
    profile: QKVProfile
    runs: pd.DataFrame
    comparisons: pd.DataFrame
    probe: pd.DataFrame
    measures: dict[str, pd.DataFrame]
    budget: pd.DataFrame = field(default_factory=pd.DataFrame)
    # run_id -> the loss on a run's first training batch, before its first update, for the
    # runs that start from another run's model (``start_losses``)
    starts: pd.DataFrame = field(default_factory=pd.DataFrame)
    published: dict[str, float] = field(default_factory=lambda: dict(PUBLISHED_SYMMETRY))
    published_source: str = PUBLISHED_SOURCE
    meta: dict[str, Any] = field(default_factory=dict)
    # frames derived from the fields above, computed once per StudyData by the function that
    # owns each (e.g. ``compute.share.shares``); never written by render
    derived: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def measure(self, name: str) -> pd.DataFrame:
        """The records of one measure (an empty frame when it has none)."""
        return self.measures.get(name, pd.DataFrame())

    def compared(self, experiment: str | tuple[str, ...], **where) -> pd.DataFrame:
        """Comparison rows of some experiments whose columns equal ``where``."""
        exps = (experiment,) if isinstance(experiment, str) else experiment
        df = self.comparisons
        if df.empty:
            return df
        df = df[df.experiment.isin(exps)]
        return select(df, **where)


def select(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows whose columns equal the given values (a missing column matches nothing)."""
    for k, v in where.items():
        if k not in df:
            return df.iloc[0:0]
        df = df[df[k] == v]
    return df


def chance(task: str, profile: QKVProfile, **options) -> float | None:
    """The chance level of a task's own metric (``vocab.TASK_METRIC``) at a profile (``options``:
    task options a run sets over the profile's, e.g. bind_codes' m): a synthetic task's
    guessing accuracy, or a text task's context-free val loss (nats; in bits per character
    where the task is judged on them); None if unknown."""
    try:
        opts = {**profile.task_options.get(task, {}), **options}
        t = get_task(task, **opts)
        level = getattr(t, "chance", None)
        if level is not None and TASK_METRIC.get(task) == "bits_per_char":
            meta = t.data.meta  # bits per token × tokens per character of the train split
            level = level / math.log(2) * meta["tokens"]["train"] / meta["chars"]["train"]
        return level
    except MissingSourceError:  # a corpus not installed: no chance level, no "not learned"
        return None


def row_chance(row, profile: QKVProfile) -> float | None:
    """``chance`` of a comparison row's task, with the task options its runs set over the
    profile's (bind_codes' m)."""
    m = row.get("m")
    opts = {"m": int(m)} if isinstance(m, (int, float)) and math.isfinite(m) else {}
    return chance(row["task"], profile, **opts)


def comparisons(runs: pd.DataFrame, profile: QKVProfile | None = None) -> pd.DataFrame:
    """``stats.compare_frame`` per experiment and task, for the task's metric and the extras.

    Values are the runs' scores on the test split (``vocab.reported``); the rows' ``metric``
    names the metric. A diverged or failed run counts (``plan.families``' rule): on its task's
    own metric at the worse of the task's chance level at ``profile`` (``row_chance``) and the
    worst finished run of its comparison; on the other metrics at the worst finished run. A
    finished run without a finite test score enters the same way, as failed (``unscored``).
    """
    parts = []
    if runs.empty:
        return pd.DataFrame()
    for exp, df in runs.groupby("experiment", sort=False):
        if exp not in BY_NAME or BY_NAME[exp].role != "comparison":
            continue
        df = scored_on_test(df)
        by = [c for c in GROUP_BY if c in df and df[c].notna().any()]
        for task, sub in df.groupby("task", sort=True):
            metrics = [TASK_METRIC.get(task, "val_loss"), *BY_NAME[exp].metrics]
            for metric in dict.fromkeys(metrics):
                col = reported(metric)  # mlm's masked_loss: test_val_loss
                if col not in sub or sub[col].isna().all():
                    continue
                own = metric == TASK_METRIC.get(task, "val_loss") and profile is not None

                def at_chance(tags: dict, task=task) -> float | None:
                    return row_chance({**tags, "task": task}, profile)

                c = compare_frame(unscored(sub, col), col, by,
                                  lower_is_better=lower_is_better(metric),
                                  failed=at_chance if own else None)
                parts.append(c.assign(experiment=exp, metric=metric))
    return mark_control(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame()


def in_comparison(runs: pd.DataFrame) -> pd.Series:
    """Which runs belong to a "comparison" experiment (design vs standard): not tuning, probe,
    measure, scaling or conversion runs, whose designs and tags mean other things."""
    return runs.experiment.map(lambda e: e in BY_NAME and BY_NAME[e].role == "comparison")


TEST_BATCHES = "spec.train.test_batches"


def scored_on_test(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose spec scores test batches (all when no spec says). The others belong to
    an earlier definition of an experiment (a store keeps its memberships) whose tags a current
    run repeats, so they would stand in for it in a comparison."""
    if TEST_BATCHES not in runs:
        return runs
    return runs[pd.to_numeric(runs[TEST_BATCHES], errors="coerce").fillna(0) > 0]


def unscored(runs: pd.DataFrame, col: str) -> pd.DataFrame:
    """``runs`` with each finished run that lacks a finite ``col`` marked ``failed``: it then
    enters its comparison as a lost run does, never dropped."""
    vals = pd.to_numeric(runs[col], errors="coerce")
    bad = (runs.status == "done") & ~vals.map(math.isfinite)
    return runs.assign(status=runs.status.where(~bad, "failed")) if bad.any() else runs


# what one control serves: not the init (the control has no Q or K to initialize), so
# scale_train's control, read against inside from the model's own init, gates both inits
CONTROL_KEYS = ("experiment", "task", "m", "d_head", "d_model")
# Q1's scale experiments, whose runs split each width as heads × d_head = d_model (tag n_heads)
SCALE_EXPERIMENTS = ("scale_train", "scale_tune", "scale_tune_edge")


def superseded(runs: pd.DataFrame) -> pd.Series:
    """Memberships of Q1's scale experiments from before each width was split as heads ×
    d_head = d_model (two heads at every d_head, no ``n_heads`` tag): a store keeps them, and
    their tags would stand beside the current runs' in a comparison, so the study reads none."""
    if runs.empty or "experiment" not in runs:
        return pd.Series(False, index=runs.index)
    old = runs.n_heads.isna() if "n_heads" in runs else True
    return runs.experiment.isin(SCALE_EXPERIMENTS) & old


def mark_control(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the control's gate on each design's rows (``effects.attention_used``):
    ``attention_used`` (1 or 0; NaN where the experiment trains no control there), and the
    control's effect vs standard it read (``control_value`` ± ``control_half``, display unit).
    One control row (equal width, the task's own metric) serves every arm and metric of its
    experiment, task and group: standard is the same runs in both arms. Standard's and the
    control's own rows are not gated, and its rows on a metric that is not learned (throughput,
    ``Metric.gated``) are dropped: the control answers one question, and its runs may be
    trained at another time than the others (a store's new runs), so its speed is not theirs."""
    if df.empty or not {"design", "metric", "task"} <= set(df):
        return df.assign(attention_used=float("nan"), control_value=float("nan"),
                         control_half=float("nan"))
    ungated = df.metric.map(lambda k: not getattr(metric_of(k), "gated", True))
    df = df[~((df.design == CONTROL) & ungated)].reset_index(drop=True)
    for col in ("attention_used", "control_value", "control_half"):
        df[col] = float("nan")
    own = df.metric == df.task.map(TASK_METRIC)
    equal = df.arm == "equal" if "arm" in df else True
    keys = [k for k in CONTROL_KEYS if k in df]
    for _, r in df[(df.design == CONTROL) & own & equal].iterrows():
        used = attention_used(r.to_dict())
        if used is None:
            continue
        e = effect(r.to_dict())
        same = ~df.design.isin(["standard", CONTROL])
        for k in keys:
            same &= (df[k].isna() if pd.isna(r[k]) else df[k] == r[k])
        df.loc[same, ["attention_used", "control_value", "control_half"]] = \
            [float(used), e.value, e.half if e.half is not None else float("nan")]
    return df


def budget(store: Store, runs: pd.DataFrame) -> pd.DataFrame:
    """Has training flattened? Per real-text task and design (equal arm, the comparison
    experiments' runs): mean val loss over seeds at the evaluation nearest half the budget and
    at the end, and the change between them in %."""
    cols = ["task", "design", "half_step", "steps", "seeds", "half", "full", "change_pct"]
    if runs.empty or "arm" not in runs:
        return pd.DataFrame(columns=cols)
    sel = runs[(runs.status == "done") & (runs.arm == "equal")
               & runs.task.isin(["lm", "lm_char", "mlm", "translate"])
               & in_comparison(runs) & ~runs.experiment.isin(["lm_scaling", "scale_train"])
               ].drop_duplicates("run_id")
    if sel.empty:
        return pd.DataFrame(columns=cols)
    m = metrics_frame(store, sel.run_id)
    m = m[m.name == "val_loss"].merge(sel[["run_id", "task", "design", "step"]].rename(
        columns={"step": "steps"}), on="run_id")
    out = []
    for (task, design), g in m.groupby(["task", "design"]):
        steps = int(g.steps.max())
        evals = sorted(set(g.step) - {0, steps})
        if not evals:
            continue
        half = min(evals, key=lambda s: (abs(s - steps / 2), s))
        h, f = g[g.step == half].value.mean(), g[g.step == steps].value.mean()
        out.append({"task": task, "design": design, "half_step": int(half), "steps": steps,
                    "seeds": int(g.run_id.nunique()), "half": h, "full": f,
                    "change_pct": 100 * (f / h - 1)})
    return pd.DataFrame(out, columns=cols)


def start_losses(store: Store, runs: pd.DataFrame) -> pd.DataFrame:
    """``run_id, start_loss``: the loss on the first training batch, before any update, of each
    run that starts from another run's model (``spec.from_run``): where a converted model
    begins. Every such run of one seed draws the same first batch. The trainer logs it as
    step 1 (steps count updates done; the loss is computed before the update it makes)."""
    col = "spec.from_run.tie"
    if runs.empty or col not in runs:
        return pd.DataFrame(columns=["run_id", "start_loss"])
    sel = runs[runs[col].notna()].drop_duplicates("run_id")
    m = metrics_frame(store, sel.run_id)
    m = m[(m.step == 1) & (m.name == "train_loss")]
    return m[["run_id", "value"]].rename(columns={"value": "start_loss"}).reset_index(drop=True)


def probe(store: Store, runs: pd.DataFrame) -> pd.DataFrame:
    """Scale-probe statistics per run and probed step, and each run's final loss on the test
    split (stat ``val_loss``, the metric's name; ``vocab.reported``)."""
    cols = ["scale", "d_head", "seed", "step", "stat", "value"]
    pr = scored_on_test(runs[(runs.experiment == "scale_probe") & (runs.status == "done")]) \
        if not runs.empty else runs
    if pr.empty:
        return pd.DataFrame(columns=cols)
    tags = pr[["run_id", "scale", "d_head", "seed"]]
    m = metrics_frame(store, pr.run_id)
    m = m[m.name.isin([f"probe/{s}" for s in PROBE_STATS])]
    m = m.assign(stat=m.name.str.removeprefix("probe/")).merge(tags, on="run_id")
    loss = pr[reported("val_loss")] if reported("val_loss") in pr else float("nan")
    end = pr.assign(stat="val_loss", value=loss)[["scale", "d_head", "seed", "step", "stat",
                                                  "value"]]
    out = pd.concat([m[cols], end], ignore_index=True)
    return out.astype({"d_head": int, "seed": int, "step": int})


def current(df: pd.DataFrame, name: str) -> pd.Series:
    """Which records of a study measure its current code would store: ``MEASURE_VERSION``,
    and for ``pretrained`` the analysis' ``SUMMARY_VERSION`` (records of older versions stay in
    the store, beside the recomputed ones, and must not be read twice)."""
    keep = df.get("spec.version", pd.Series(MEASURE_VERSION, index=df.index)) == MEASURE_VERSION
    if name == "pretrained" and "spec.summary_version" in df:
        keep &= df["spec.summary_version"] == SUMMARY_VERSION
    return keep


def measures(store: Store, runs: pd.DataFrame, profile: str) -> dict[str, pd.DataFrame]:
    """Each measure's records at this profile, with the tags of the run it read, if any."""
    tags = runs[[c for c in RUN_TAGS if c in runs] + ["run_id"]].drop_duplicates("run_id") \
        if not runs.empty else pd.DataFrame(columns=["run_id"])
    out = {}
    for name in store.measure_names():
        df = measures_frame(store, name)
        if df.empty:
            continue
        if "spec.profile" in df:  # this study's measures, per profile, current versions only
            df = df[(df["spec.profile"] == profile) & current(df, name)]
        # else another tool's (e.g. `qkvlab tiecost`'s tie_cost): the same at every profile
        if df.empty:
            continue
        if df.run_id.notna().any():
            df = df.drop(columns=[c for c in RUN_TAGS if c in df]).merge(tags, on="run_id",
                                                                      how="left")
        out[name] = df.reset_index(drop=True)
    return out


def load(store: Store, profile: str | QKVProfile, meta: dict[str, Any] | None = None
         ) -> StudyData:
    """Everything the report shows, from the store (``profile``: a name or the profile)."""
    p = get_profile(profile)
    runs = pd.concat([runs_frame(store, e, p.name) for e in ORDER], ignore_index=True)
    runs = runs[~superseded(runs)].reset_index(drop=True)
    if not runs.empty and "arm" not in runs:  # only runs without arms (the scaling profile's)
        runs = runs.assign(arm=None)
    cmp = correct(comparisons(runs, p))
    return StudyData(profile=p, runs=runs, comparisons=cmp,
                     probe=probe(store, runs), measures=measures(store, runs, p.name),
                     budget=budget(store, runs), starts=start_losses(store, runs),
                     meta=dict(meta or {}))
