"""The results store as tidy pandas DataFrames: what reports and exports read.

``runs_frame``: one row per (run, experiment membership); columns are the membership
(``experiment``, ``profile``), the run's tags (``design``, ``arm``, ``task``, ``seed``, ...),
its bookkeeping (``run_id``, ``status``, ``step``, ``wall_s``, ``tokens_per_s``, ``n_params``,
``threads``: the torch threads it trained with, ``params.<kind>``), its final metrics
(``val_loss``, ``accuracy``, ...) and its whole spec flattened to dotted columns
(``spec.model.d_head``, ``spec.task_options.seq_len``, ``spec.train.lr``). ``measures_frame``:
one row per stored record of a measure, with ``measure_id``, ``run_id`` and the measure's spec
as ``spec.*`` columns. Code that reads results selects columns; it never parses keys.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from qkvlab.experiments.store import Store

RUN_COLUMNS = ("status", "step", "wall_s", "train_s", "tokens", "tokens_per_s", "n_params",
               "threads", "git_rev")
EXPORT_FORMATS = ("csv", "parquet", "json", "table")


def runs_frame(store: Store, experiment: str | None = None,
               profile: str | None = None) -> pd.DataFrame:
    """Every membership of every run (or of one experiment/profile) as one tidy row."""
    rows = []
    for r in store.runs(experiment, profile):
        d = {"experiment": r["experiment"], "profile": r["profile"], "run_id": r["id"],
             **(r["tags"] or {})}
        d.update({k: r.get(k) for k in RUN_COLUMNS})  # a store older than a column: None
        d.update(params=r["params"] or {}, **r["final"], spec=r["spec"] or {})
        rows.append(d)
    return pd.json_normalize(rows, sep=".")  # nested params/spec -> "params.x", "spec.a.b"


def measures_frame(store: Store, name: str) -> pd.DataFrame:
    """One row per record of measure ``name``: ``measure_id``, ``run_id``, ``spec.*`` and the
    record's own fields."""
    rows = []
    for m in store.measure_rows(name):
        base = {"measure_id": m["measure_id"], "run_id": m["run_id"], "spec": m["spec"]}
        rows += [{**base, **rec} for rec in m["records"]]
    return pd.json_normalize(rows, sep=".")


def metrics_frame(store: Store, run_ids) -> pd.DataFrame:
    """Per-step metrics of some runs: columns run_id, step, name, value."""
    rows = [{"run_id": rid, **m} for rid in dict.fromkeys(run_ids) for m in store.metrics(rid)]
    return pd.DataFrame(rows, columns=["run_id", "step", "name", "value"])


def export(df: pd.DataFrame, fmt: str, path: str | os.PathLike | None = None) -> str | None:
    """Write a frame as csv/parquet/json to ``path`` (or return csv/json/table text if no path).

    Raises:
        ValueError: unknown format, or parquet without pyarrow/fastparquet installed.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format: {fmt!r} is not one of {list(EXPORT_FORMATS)}")
    if fmt == "parquet":
        if path is None:
            raise ValueError("out: parquet is binary; give a file path with --out")
        try:
            df.to_parquet(path)
        except ImportError:
            raise ValueError("format: parquet needs pyarrow (pip install pyarrow), which is not "
                             "installed; use --format csv") from None
        return None
    spec_cols = [c for c in df.columns if str(c).startswith("spec.")]
    text = {"csv": lambda: df.to_csv(index=False),
            "json": lambda: df.to_json(orient="records", indent=1),
            "table": lambda: df.drop(columns=spec_cols).to_string(index=False)}[fmt]()
    if path is None:
        return text
    Path(path).write_text(text)
    return None
