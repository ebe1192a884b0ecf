"""Optional TensorBoard logging of a sweep's runs: ``qkvlab sweep NAME --tensorboard DIR``.

The SQLite store stays the record; TensorBoard is a live view of it. Each run writes to
``DIR/<task>-<design>-<run id[:8]>`` every metric it sends to the store (train loss, learning
rate, grad norm, eval metrics, probe statistics) at the same step, plus its spec as text.
A resumed run appends to the same folder; TensorBoard shows the latest value of a step.
Needs the ``tensorboard`` package (``pip install 'qkvlab[tensorboard]'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qkvlab.experiments.store import canonical

INSTALL = "pip install 'qkvlab[tensorboard]'"


def check_available() -> None:
    """ValueError naming the package to install when TensorBoard logging cannot work."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ValueError("tensorboard: logging needs the tensorboard package "
                         f"({INSTALL})") from None


def run_name(rid: str, spec: Mapping[str, Any]) -> str:
    """``<task>-<design>-<id[:8]>``: readable in TensorBoard's run list, unique by the id."""
    model = spec.get("model") or {}
    return f"{spec.get('task', 'run')}-{model.get('design', 'standard')}-{rid[:8]}"


class RunLogger:
    """``on_log(step, metrics)`` callback writing scalars of one run; ``close()`` when done."""

    def __init__(self, root: str | Path, rid: str, spec: Mapping[str, Any]) -> None:
        check_available()
        from torch.utils.tensorboard import SummaryWriter  # lazy: optional extra [tensorboard]

        self.log_dir = Path(root) / run_name(rid, spec)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.writer.add_text("spec", f"run `{rid}`\n\n```json\n{canonical(dict(spec))}\n```")

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.writer.add_scalar(k, float(v), int(step))

    def close(self) -> None:
        self.writer.close()

