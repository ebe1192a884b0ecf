"""Training: the trainer, resumable safetensors checkpoints, DDP under torchrun."""

from qkvlab.train.build import (allow_task_modules, apply_init, build_seeded, make_task,
                                model_config, start_from)
from qkvlab.train.checkpoints import load_checkpoint, read_checkpoint, save_checkpoint
from qkvlab.train.config import FromRun, InitConfig, ProbeConfig, RunSpec, TrainConfig
from qkvlab.train.distributed import DistInfo, setup, teardown
from qkvlab.train.precision import resolve_precision
from qkvlab.train.trainer import (
                                  TIMING_PARTS,
                                  TrainResult,
                                  evaluate,
                                  lr_at,
                                  make_optimizer,
                                  run_from_spec,
                                  train,
)

__all__ = ["TIMING_PARTS", "DistInfo", "FromRun", "InitConfig", "ProbeConfig", "RunSpec",
           "TrainConfig", "TrainResult", "allow_task_modules", "apply_init", "build_seeded",
           "evaluate", "load_checkpoint", "lr_at", "make_optimizer", "make_task", "model_config",
           "read_checkpoint", "resolve_precision", "run_from_spec", "save_checkpoint", "setup",
           "start_from", "teardown", "train"]
