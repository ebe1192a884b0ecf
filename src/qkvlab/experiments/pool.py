"""How a sweep trains its runs: in its own process, in a pool of worker processes, or as Ray
tasks, with the progress bar following the store.

``backend="ray"`` submits runs as Ray tasks to an existing cluster (``ray.init(address=...)``,
or a local instance); the driver alone writes to the store, so the store stays one local file.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

import torch

from qkvlab.experiments.store import FINISHED, Store
from qkvlab.experiments.worker import execute, step_logger, work
from qkvlab.inputs import EnvironmentFailure
from qkvlab.train.build import TASK_MODULES, allow_task_modules

BACKENDS = ("local", "ray")

# Local worker processes when none is asked for: one-thread workers, up to two. On 2 cores,
# two one-thread workers swept 24 quick runs in 134-137 s against 181-202 s for one worker
# with two threads (AMD EPYC, 2026-11-25): these small models do not split well over threads.
DEFAULT_WORKERS = min(2, os.cpu_count() or 1)
# Rounds of worker processes that all died while no run finished or failed, in a row, before a
# sweep gives up and says why: a worker that cannot run (a full disk, a store it cannot write)
# dies the same way each time, and restarting it forever would hang the sweep.
MAX_DEAD_ROUNDS = 3


class WorkersDied(RuntimeError):
    """Every worker of several rounds in a row died before finishing a run; names the cause."""


def check_pool(workers: int, backend: str, threads: int | None = None) -> None:
    """Refuse a backend, worker or thread count no worker could run with, before any starts
    (``threads=-2`` made every spawned worker fail at once, and the sweep start new ones)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {list(BACKENDS)}")
    for name, n in (("workers", workers), ("threads", 1 if threads is None else threads)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name}: {n!r} must be a positive integer")


def train_runs(store: Store, ids: list[str], counted: list[str], backend: str, workers: int,
               threads: int, bar, tensorboard: str | None) -> None:
    """Train every run of ``ids`` not finished, until each is finished or failed once here;
    ``bar`` counts the finished runs of ``counted``."""
    tried: set[str] = set()
    dead_rounds = 0
    while True:
        store.reclaim()
        show_finished(bar, store, counted)
        # a run that failed in this sweep is not retried until the next sweep
        todo = [i for i in ids if store.status(i) == "pending"
                or (store.status(i) == "failed" and i not in tried)]
        busy = [i for i in ids if store.status(i) == "running"]
        if not todo and not busy:  # all finished, or failed in this sweep
            break
        if not todo:  # another live sweep holds them: wait rather than duplicate
            time.sleep(1.0)
            continue
        if backend == "ray":
            _ray(store, todo, progress=bar, tensorboard=tensorboard)
        elif workers == 1:
            _local_inline(store, todo, threads, bar, tensorboard)
        else:
            before = {i: store.status(i) for i in todo}
            causes = _local_pool(str(store.path), todo, workers, threads, bar, store, counted,
                                 tensorboard)
            moved = any(store.status(i) in (*FINISHED, "failed") and store.status(i) != s
                        for i, s in before.items())
            dead_rounds = 0 if moved or not all(causes) else dead_rounds + 1
            if dead_rounds >= MAX_DEAD_ROUNDS:
                raise WorkersDied(f"sweep: every worker process died {dead_rounds} times in a "
                                  f"row without finishing a run; last: {causes[-1]}")
        tried.update(todo)
    show_finished(bar, store, counted)


def show_finished(bar, store: Store, counted: list[str]) -> None:
    """Move ``bar`` to the number of finished runs of ``counted`` with ``update``, which keeps
    the bar's redraw interval (a line every 30 s where stderr is a log file), not ``refresh``,
    which redraws at once: polled twice a second, it wrote two log lines a second."""
    done = sum(store.status(i) in FINISHED for i in counted)
    if done != bar.n:
        bar.update(done - bar.n)


def _local_inline(store: Store, todo: list[str], threads: int, bar,
                  tensorboard: str | None = None) -> None:
    torch.set_num_threads(threads)
    for rid in todo:
        work(str(store.path), [rid], threads, tensorboard=tensorboard)
        bar.update(1)


def _local_pool(db: str, todo: list[str], workers: int, threads: int, bar, store: Store,
                counted: list[str], tensorboard: str | None = None) -> list[str]:
    """Train ``todo`` in ``workers`` spawned processes; why each one died ("" if it did not)."""
    ctx = mp.get_context("spawn")  # fork after torch's thread pools start is unsafe
    errors = ctx.SimpleQueue()
    procs = []
    for k in range(workers):
        # each worker starts on its own share, then helps with the rest (claims keep it exact)
        p = ctx.Process(target=_worker, args=(errors, db, todo[k::workers] + todo, threads,
                                              os.getpid()),
                        kwargs={"tensorboard": tensorboard, "spawned": time.time(),
                                "task_modules": sorted(TASK_MODULES)},  # this process's opt-in
                        daemon=False)
        p.start()
        procs.append(p)
    while any(p.is_alive() for p in procs):
        time.sleep(0.5)
        show_finished(bar, store, counted)
    said, stop = {}, []
    while not errors.empty():
        pid, why, environment = errors.get()
        said[pid] = why
        stop += [why] if environment else []
    for p in procs:
        p.join()
    if stop:  # a full disk: the next workers would fail the same way
        raise EnvironmentFailure(stop[0])
    return [said.get(p.pid, "") or (f"exit status {p.exitcode}" if p.exitcode > 0 else
                                    f"killed by signal {-p.exitcode}") if p.exitcode else ""
            for p in procs]


def _worker(errors, *args, **kwargs) -> None:
    """A spawned worker: ``work``; if it fails, the sweep is told why in one line (its
    traceback kept in a file; an ``EnvironmentFailure``, a full disk, stops the sweep with its
    line) and the process exits with status 1."""
    try:
        work(*args, **kwargs)
    except EnvironmentFailure as e:  # its message is the line; the disk may hold no file
        errors.put((os.getpid(), " ".join(str(e).split()), True))
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 (the sweep says it, once, instead of each worker)
        try:
            fd, path = tempfile.mkstemp(prefix="qkvlab-worker-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                traceback.print_exception(e, file=f)
        except OSError:  # a full disk: the line alone, not a second traceback
            path = "(could not be written)"
        errors.put((os.getpid(), f"{type(e).__name__}: {' '.join(str(e).split())[:500]} "
                                 f"(traceback in {path})", False))
        sys.exit(1)


def _ray(store: Store, todo: list[str], progress, tensorboard: str | None = None) -> None:
    try:
        import ray  # lazy: optional extra [ray]
    except ImportError:
        raise ValueError("backend: 'ray' needs Ray (pip install 'ray[default]'), which is not "
                         "installed; use --backend local") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True)
    remote = ray.remote(_ray_task)
    pending = {}
    for rid in todo:
        if store.claim(rid):
            try:
                spec = store.runs_spec(rid)  # refused if it does not hash to its id
            except ValueError as e:
                store.fail(rid, str(e))
                continue
            pending[remote.remote(spec, rid, sorted(TASK_MODULES))] = rid
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        rid = pending.pop(done[0])
        try:
            out = ray.get(done[0])
            t = time.perf_counter()
            on_log, close = step_logger(store, rid, store.runs_spec(rid), tensorboard)
            try:  # the driver logs a Ray run's history once it is back
                for rec in out["history"]:
                    on_log(rec["step"], {k: v for k, v in rec.items() if k != "step"})
            finally:
                close()
            store.finish(rid, out["status"], out["step"], out["final"], out["info"])
            store.record_timings(rid, {**out["info"]["timings"],
                                       "store": time.perf_counter() - t})
        except Exception:
            store.fail(rid, traceback.format_exc())
        progress.update(1)


def _ray_task(spec: Mapping[str, Any], rid: str, task_modules=()) -> dict[str, Any]:
    allow_task_modules(*task_modules)
    with tempfile.TemporaryDirectory() as d:  # checkpoints live on the Ray node
        return execute(spec, Path(d) / rid)

