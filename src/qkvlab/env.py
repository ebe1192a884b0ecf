"""The environment a result was produced in: library versions, hardware, git revision.

One recorder for every layer: each training run stores it with its results, and the report
prints it. It imports nothing from qkvlab at module level (``qkvlab.__version__`` is read
when called), so any module may import it without a cycle.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy
import safetensors
import scipy
import torch

__all__ = ["environment", "versions", "hardware", "cpu_model", "git_revision"]


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """HEAD of the checkout qkvlab runs from, with ``+dirty`` if it has changes; None if
    qkvlab is not in a git checkout or git is missing (never raises)."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str | None:
    """The CPU's name: ``model name`` from /proc/cpuinfo (Linux), else
    ``platform.processor()``, else None (never raises)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def versions() -> dict[str, str]:
    """``{qkvlab, torch, numpy, safetensors, scipy, python}`` version strings."""
    import qkvlab  # at call time: qkvlab/__init__ may still be importing when this module loads

    return {"qkvlab": qkvlab.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "safetensors": safetensors.__version__, "scipy": scipy.__version__,
            "python": platform.python_version()}


def _cpu_capability() -> str | None:
    try:
        return torch.backends.cpu.get_cpu_capability()  # e.g. "AVX2", "AVX512", "DEFAULT"
    except (AttributeError, RuntimeError):
        return None


def hardware() -> dict[str, Any]:
    """``{machine, processor, cpu_model, system, cpu_count, torch_threads, cuda,
    cpu_capability}``; ``cuda`` is the first CUDA device's name or None."""
    return {"machine": platform.machine(), "processor": platform.processor() or None,
            "cpu_model": cpu_model(), "system": platform.system(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu_capability": _cpu_capability()}


def environment() -> dict[str, Any]:
    """``{versions, hardware, git_rev, platform}``: what every run and the report record.

    ``platform`` is ``platform.platform()`` (OS, kernel and libc in one string). Never raises
    for a missing git or /proc.
    """
    return {"versions": versions(), "hardware": hardware(), "git_rev": git_revision(),
            "platform": platform.platform()}
