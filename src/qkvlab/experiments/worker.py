"""One run, and the worker process that trains a sweep's runs one after another.

``execute`` trains one spec (resuming from its run folder) and returns what the store records.
``work`` is the loop a sweep's worker process runs: it walks the sweep's list and *claims*
each run atomically in SQLite, so two sweeps of the same experiment (or overlapping
experiments) share the work instead of repeating it. A worker that dies (SIGKILL, OOM) leaves
its run ``running``; the next sweep sees the process is gone, marks the run pending, and its
worker resumes it from its last checkpoint. Workers die with their sweep (PR_SET_PDEATHSIG on
Linux), so a killed sweep leaves no orphan writing to the store. A run that fails for want of
disk space (``ENOSPC``, ``EDQUOT``) is marked failed, so a later sweep retries it, and stops its
worker with an ``EnvironmentFailure`` naming the cause and the path: every run after it would
fail the same way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sqlite3
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

import torch

from qkvlab.env import environment
from qkvlab.experiments.ids import run_id
from qkvlab.experiments.probe import ScaleProbe
from qkvlab.experiments.store import Store, canonical
from qkvlab.experiments.tensorboard import RunLogger
from qkvlab.inputs import EnvironmentFailure
from qkvlab.models import count_params
from qkvlab.train import RunSpec, allow_task_modules, run_from_spec
from qkvlab.train.distributed import DistInfo, default_device
from qkvlab.train.trainer import FINAL_MODEL


def execute(spec: RunSpec | Mapping[str, Any], run_dir: Path, *, on_log=None,
            progress: bool = False, desc: str = "run") -> dict[str, Any]:
    """Train one spec (resuming from ``run_dir``) and return what the store records.

    Returns:
        ``{status, step, final, history, info}`` where ``info`` holds timings (``wall_s``,
        ``train_s`` and ``timings``, the trainer's seconds per part), parameter counts,
        tokens/s, versions, hardware and git revision, and ``precision_used`` (the precision
        the run trained in: bf16 may fall back to fp32 on a CPU). The store keeps
        ``precision_used`` inside the ``hardware`` JSON (``info["hardware"]["precision_used"]``),
        since it is the hardware's answer to the requested precision, beside the ``device`` it
        trained on (``distributed.default_device``: a GPU where there is one, unless
        ``$QKVLAB_DEVICE`` says otherwise), and ``threads`` (the
        torch threads it trained with, which change its last bits but not its id) in the
        run's own column.
    """
    spec = RunSpec.from_dict(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(canonical(spec.to_dict()) + "\n")
    holder: dict[str, Any] = {}

    def factory(model, task):
        holder["params"] = count_params(model)
        if spec.probe is not None:
            return ScaleProbe(model, spec.probe.steps, spec.probe.sat)
        return None

    t0 = time.perf_counter()
    device = default_device()  # a GPU where there is one, unless QKVLAB_DEVICE says otherwise
    # a run that starts from another run's model finds it in that run's folder, its sibling
    parent = (run_dir.parent / run_id(spec.from_run.spec) / FINAL_MODEL
              if spec.from_run is not None else None)
    res = run_from_spec(spec, run_dir=run_dir, on_log=on_log, callback_factory=factory,
                        progress=progress, desc=desc, dist_info=DistInfo(device=device),
                        parent_model=parent)
    if res.status == "done":  # the optimizer state is only needed to resume an unfinished run
        (run_dir / "checkpoint.safetensors").unlink(missing_ok=True)
    env = environment()
    env["hardware"] = {**env["hardware"], "precision_used": res.precision_used,
                       "device": device}
    info = {"wall_s": time.perf_counter() - t0, "train_s": res.train_s, "tokens": res.tokens,
            "tokens_per_s": res.tokens_per_s, "params": holder.get("params"),
            "n_params": (holder.get("params") or {}).get("total"), "timings": res.timings,
            "precision_used": res.precision_used, "threads": torch.get_num_threads(), **env}
    return {"status": res.status, "step": res.step, "final": res.final, "history": res.history,
            "info": info}


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when its parent dies; exit if it already has."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a killed sweep may leave a worker finishing its current run
    if os.getppid() != parent:
        os._exit(1)


def step_logger(store: Store, rid: str, spec: Mapping[str, Any], tensorboard: str | None,
                spent: dict[str, float] | None = None):
    """``(on_log, close)``: per-step metrics to the store, and to TensorBoard if asked.
    The seconds the store writes take are added to ``spent["log_store"]``."""
    spent = {} if spent is None else spent

    def to_store(step: int, metrics: Mapping[str, float]) -> None:
        t = time.perf_counter()
        store.log(rid, step, metrics)
        spent["log_store"] = spent.get("log_store", 0.0) + time.perf_counter() - t
    if not tensorboard:
        return to_store, lambda: None
    tb = RunLogger(tensorboard, rid, spec)

    def on_log(step: int, metrics: Mapping[str, float]) -> None:
        to_store(step, metrics)
        tb(step, metrics)
    return on_log, tb.close


def work(db: str, ids: list[str], threads: int, parent: int | None = None,
         progress: bool = False, tensorboard: str | None = None,
         spawned: float | None = None, task_modules=()) -> int:
    """Worker loop: claim and run each id not finished or taken; returns how many it ran.

    ``task_modules``: the modules the sweep's process opted in to for ``module:Class`` tasks
    (``train.allow_task_modules``); a spec naming any other module is refused, not imported.

    ``spawned``: the ``time.time()`` at which the sweep started this process; the seconds
    until here (interpreter start, imports) are recorded as ``startup`` of its first run.
    """
    startup = max(0.0, time.time() - spawned) if spawned is not None else 0.0
    if parent is not None:
        _die_with_parent(parent)
    torch.set_num_threads(threads)
    allow_task_modules(*task_modules)
    ran = 0
    t = time.perf_counter()
    with Store(db) as store:
        by = f"{socket.gethostname()}:{parent}" if parent is not None else store.trainer
        for rid in ids:
            if not store.claim(rid, by=by):
                continue
            # store time so far (opening it, claims lost to other workers) goes to this run
            spent = {"store": time.perf_counter() - t}
            close = None
            try:  # the id is the spec's hash: another spec under it is refused, never trained
                spec = store.runs_spec(rid)
            except ValueError as e:
                store.fail(rid, str(e))
                ran += 1
                continue
            try:
                on_log, close = step_logger(store, rid, spec, tensorboard, spent)
                out = execute(spec, store.runs_dir / rid, progress=progress, desc=rid[:8],
                              on_log=on_log)
                t = time.perf_counter()
                store.finish(rid, out["status"], out["step"], out["final"], out["info"])
                store.record_timings(rid, _run_timings(out["info"]["timings"], spent, startup,
                                                       time.perf_counter() - t))
                startup = 0.0
            except Exception as e:  # one bad config must not stop the sweep; the store
                # keeps the trace. A full disk stops it: every run after would fail alike
                full = no_space(e, store.runs_dir / rid, store.path)
                try:
                    store.fail(rid, traceback.format_exc())
                except sqlite3.Error:  # the store's disk is full too: reclaimed as pending
                    if full is None:
                        raise
                if full is not None:
                    raise EnvironmentFailure(f"sweep: {full} (run {rid} failed; a later sweep "
                                             "retries it)") from e
            finally:
                if close is not None:
                    close()
            ran += 1
            t = time.perf_counter()
    return ran


NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def no_space(exc: BaseException, where: Path, db: Path | None = None) -> str | None:
    """``no space left on device: PATH`` if ``exc`` (or an exception it was raised from) is
    an ``OSError`` for want of space, naming the file it names or else ``where``, or SQLite's
    ``database or disk is full``, naming the store ``db``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return f"{NO_SPACE[exc.errno]}: {exc.filename or where}"
        if isinstance(exc, sqlite3.Error) and db is not None and \
                getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return f"{NO_SPACE[errno.ENOSPC]}: {db}"
        exc = exc.__cause__ or exc.__context__
    return None


def _run_timings(trained: Mapping[str, float], spent: Mapping[str, float], startup: float,
                 finish_s: float) -> dict[str, float]:
    """A run's timings as the store records them: the trainer's parts, with the store writes
    that happened inside ``on_log`` (``spent["log_store"]``) moved from ``log`` to ``store``,
    which also holds the worker's other store time (``spent["store"]``) and ``finish_s``."""
    in_log = spent.get("log_store", 0.0)
    return {**trained, "log": max(0.0, trained.get("log", 0.0) - in_log),
            "store": spent.get("store", 0.0) + in_log + finish_s, "startup": startup}

