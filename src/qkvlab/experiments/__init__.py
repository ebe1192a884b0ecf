"""Experiments: named run lists, profiles, sweeps, the SQLite results store, statistics."""

from qkvlab.experiments.registry import (EXPERIMENTS, PROFILES, Profile, describe, experiment,
                                         get_profile, runs_of)
from qkvlab.experiments.runner import execute, sweep
from qkvlab.experiments.stats import compare, mean_ci, paired
from qkvlab.experiments.store import DEFAULT_DB, Store, run_id

__all__ = ["DEFAULT_DB", "EXPERIMENTS", "PROFILES", "Profile", "Store", "compare", "describe",
           "execute", "experiment", "get_profile", "mean_ci", "paired",
           "run_id", "runs_of", "sweep"]
