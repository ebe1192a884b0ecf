"""Data-parallel training with DDP, launched by ``torchrun`` (gloo on CPU, NCCL on GPU).

Every rank draws the *same* global batch from the same seeded generator and keeps its own
contiguous slice, so ``n`` processes see exactly the batches one process would see with the
same global batch size; DDP averages the gradients, which equals the gradient of the mean
loss over the global batch when every slice holds the same number of loss terms.

This module holds only the process-group helpers; the trainer imports them, never the other
way round. The command torchrun runs is ``qkvlab.train.__main__``::

    torchrun --nproc_per_node 2 -m qkvlab.train spec.json --out result.json
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP


DEVICE_ENV = "QKVLAB_DEVICE"  # where a sweep's runs train: cpu, cuda or cuda:N


def default_device() -> str:
    """The device a run trains on when nothing else says: ``$QKVLAB_DEVICE`` (what ``qkvlab
    sweep/study --device`` sets, so that worker processes inherit it), else ``cuda`` where
    PyTorch sees a GPU, else ``cpu``.

    Raises:
        ValueError: ``$QKVLAB_DEVICE`` is not cpu/cuda/cuda:N, or names CUDA where PyTorch sees
            no GPU.
    """
    want = os.environ.get(DEVICE_ENV, "").strip()
    if not want:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = want.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ValueError(f"{DEVICE_ENV}={want!r}: not a device; use cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{DEVICE_ENV}={want!r}: PyTorch sees no GPU here")
    return want


def use_device(device: str | None) -> str:
    """Make ``device`` (None: leave the default) the one this process's sweeps train on, for
    its worker processes too (``$QKVLAB_DEVICE``); returns the device runs will use.

    Raises:
        ValueError: as ``default_device``; the environment is then left as it was.
    """
    if device is None:
        return default_device()
    if not device.strip():  # "" would read as "not set" below: the default, not what was asked
        raise ValueError(f"device: {device!r} names no device; use cpu, cuda or cuda:N")
    old = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = device
    try:
        return default_device()
    except ValueError:
        if old is None:
            os.environ.pop(DEVICE_ENV)
        else:
            os.environ[DEVICE_ENV] = old
        raise


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world`` processes, on ``device``."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device: str | None = None) -> DistInfo:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, ...).

    Without those variables this is a single process and nothing is initialized.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo(device=device or default_device())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device is None:
        device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistInfo(rank=rank, world=world, local_rank=local, device=device)


def teardown() -> None:
    """Leave the process group if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, info: DistInfo) -> nn.Module:
    """``model`` wrapped in DDP when there is more than one process, else unchanged."""
    if info.world == 1:
        return model
    ids = [info.local_rank] if info.device.startswith("cuda") else None
    return DDP(model, device_ids=ids)


def shard(batch: dict[str, Tensor], info: DistInfo) -> dict[str, Tensor]:
    """This rank's contiguous slice of every (B, ...) tensor of a global batch.

    Raises:
        ValueError: the batch size is not divisible by the number of processes.
    """
    if info.world == 1:
        return batch
    out = {}
    for k, t in batch.items():
        if not isinstance(t, Tensor) or t.dim() == 0:
            out[k] = t
            continue
        B = t.shape[0]
        if B % info.world:
            raise ValueError(f"batch_size: {B} is not divisible by the {info.world} processes")
        n = B // info.world
        out[k] = t[info.rank * n:(info.rank + 1) * n]
    return out


def mean_across(x: Tensor, info: DistInfo) -> Tensor:
    """Mean of a scalar over all ranks (the logged loss is the global-batch loss)."""
    if info.world == 1:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y / info.world


if __name__ == "__main__":  # the entry point moved; say so rather than exit 0 with no result
    sys.exit("qkvlab.train.distributed is no longer a command; run "
             "`torchrun --nproc_per_node N -m qkvlab.train spec.json --out result.json`")
