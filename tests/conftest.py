import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/reference.py is the float64 oracle

import contextlib  # noqa: E402

from qkvlab.experiments import registry  # noqa: E402
from qkvlab.train import allow_task_modules  # noqa: E402

# The suite's own module:Class tasks (ToyTask, BrokenTask): opted in as a user would
# (--task-module), passed on by a sweep to its workers; no other module's task is imported.
TEST_TASK_MODULES = ("test_train_trainer", "test_experiments_store")
allow_task_modules(*TEST_TASK_MODULES)


def scored(final: dict) -> dict:
    """A run's final metrics as the trainer stores them when it scores the held-out test split:
    each metric also as ``test_<metric>`` (here the same value), which the study reports."""
    from qkvlab.studies.qkv.plan.vocab import reported
    return {**final, **{reported(k): v for k, v in final.items()}}


@contextlib.contextmanager
def temporary_experiment(name: str, runs):
    """Register ``name`` returning ``runs`` (a list of (spec, tags)) for one test, then remove it."""
    registry.experiment(name)(lambda profile: list(runs))
    try:
        yield name
    finally:
        registry.EXPERIMENTS.pop(name)
        registry.QUESTIONS.pop(name)


def toy_runs(**train) -> list:
    """The two-design ToyTask runs (tests/test_train_trainer.py) several sweep tests share."""
    return [({"task": "test_train_trainer:ToyTask", "kind": "decoder",
              "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "design": design},
              "train": {"steps": 12, "batch_size": 4, "eval_batches": 1, "eval_batch_size": 4,
                        "log_every": 2, "eval_every": 6, "seed": 0, **train}},
             {"design": design}) for design in ("standard", "tied_kv")]
