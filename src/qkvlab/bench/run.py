"""Every benchmark in one call: ``run_bench`` returns the JSON-able result that ``tables``
prints and ``qkvlab bench`` saves; ``check_device`` refuses a device it cannot run on before
anything is measured.
"""

from __future__ import annotations

import torch

from qkvlab.bench.decode import bench_decode
from qkvlab.bench.kv import bench_kv
from qkvlab.bench.designs import bench_attention, bench_fold_alt, cache_bytes_table
from qkvlab.bench.training import bench_training
from qkvlab.env import cpu_model
from qkvlab.train.precision import cpu_bf16_report


def default_device() -> str:
    """``cuda`` where PyTorch sees a GPU, else ``cpu`` (as the trainer picks)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> str:
    """``device`` as a torch device string the bench can run on (``cpu`` or an existing CUDA
    device); a ValueError naming what is wrong otherwise."""
    try:
        d = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {device!r} is not a torch device ({e})") from None
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r}: the bench runs on cpu or cuda")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r}: no CUDA device here "
                             "(torch.cuda.is_available() is False)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r}: only {torch.cuda.device_count()} CUDA "
                             "device(s) here")
    return str(d)


def measure_bf16(size: str, cpu: dict, device: str = "cpu") -> bool:
    """Whether the bench trains ``size`` in bf16 too: always on a GPU and at the small size; at
    the large one on the CPU only where it may have native bf16. Without it bf16 autocast is
    10-30x slower and would take most of the bench's time (docs/bench-history.md), and the
    probe and the small size already show that cost."""
    return device != "cpu" or size == "small" or cpu.get("native_bf16") is not False


def gpu_report(device: str) -> dict:
    """The CUDA device the bench runs on: its name, compute capability, whether it supports
    bf16, and PyTorch's CUDA version."""
    d = torch.device(device)
    return {"gpu": torch.cuda.get_device_name(d), "capability": ".".join(
        map(str, torch.cuda.get_device_capability(d))), "bf16": torch.cuda.is_bf16_supported(),
        "cuda": torch.version.cuda}


def run_bench(sizes=("small", "large"), peers=True, quick=False, nanogpt=None, compile=False,
              device: str = "cpu", log=print) -> dict:
    """Every benchmark of the core library; returns a JSON-able dict. ``cpu`` holds the CPU
    capability, whether it has native bf16, and the measured bf16/fp32 time ratio; the bf16
    training figures are bf16 on purpose (as ``precision="bf16_force"``), wherever it is slow.
    ``nanogpt``: a nanoGPT checkout to add as a peer; ``compile``: also time qkvlab under
    ``torch.compile`` (and its compile time). ``device``: where training, the attention layers
    and decoding run (``gpu`` then describes the GPU); fold_alt always runs on the CPU."""
    res: dict = {"cpu": {"cpu_model": cpu_model(), **cpu_bf16_report(reps=5 if quick else 9)},
                 "device": device, "training": {}}
    if device != "cpu":
        res["gpu"] = gpu_report(device)
    for size in sizes:
        res["training"][size] = bench_training(
            size, steps=2 if size == "large" else 6, rounds=3 if quick else 7,
            peers=("hf_gpt2", "x_transformers", "litgpt") if peers else (),
            nanogpt=nanogpt if peers else None, compile=compile,
            bf16=measure_bf16(size, res["cpu"], device), device=device, log=log)
    res["attention"] = bench_attention("large", rounds=3 if quick else 5, device=device, log=log)
    if peers:
        res["decode"] = {size: bench_decode(size, new_tokens=64 if quick else 128,
                                            rounds=3 if quick else 5, device=device, log=log)
                         for size in sizes}
    res["cache_bytes"] = cache_bytes_table("large")
    res["kv_decode"] = bench_kv("small", device=device, log=log)
    res["fold_alt"] = bench_fold_alt("small", train_steps=100 if quick else 200, log=log)
    return res
