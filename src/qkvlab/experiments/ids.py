"""A run's id and the store's small helpers: canonical JSON, the hash that names a run or a
measure, and whether a worker's process still lives."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def canonical(obj: Any) -> str:
    """Sorted, compact JSON: equal configs give equal strings (and equal ids)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def run_id(spec: Any) -> str:
    """16 hex digits of sha256 over the canonical spec (a mapping, or a ``RunSpec``)."""
    d = spec.to_dict() if hasattr(spec, "to_dict") else spec
    return hashlib.sha256(canonical(d).encode()).hexdigest()[:16]


def pid_alive(pid: int | None) -> bool:
    """True if a process with ``pid`` runs on this host (zombies count as dead)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): trust kill(0)
