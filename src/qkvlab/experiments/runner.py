"""``sweep``: run every config of a named experiment into the results store.

The store is the work queue. The sweep registers the experiment's runs (id = hash of spec),
starts ``workers`` processes, and each worker walks the list and *claims* runs atomically in
SQLite, so two sweeps of the same experiment (or overlapping experiments) share the work
instead of repeating it. A worker that dies (SIGKILL, OOM) leaves its run ``running``; the
next sweep sees the process is gone, marks the run pending, and its worker resumes it from its
last checkpoint. Workers die with their sweep (PR_SET_PDEATHSIG on Linux), so a killed sweep
leaves no orphan writing to the store.

``backend="ray"`` submits runs as Ray tasks to an existing cluster (``ray.init(address=...)``,
or a local instance); the driver alone writes to the store, so the store stays one local file.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import shlex
import signal
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from qkvlab.env import environment, git_revision  # noqa: F401  (re-exported: runner.environment)
from qkvlab.experiments import registry
from qkvlab.experiments.probe import ScaleProbe
from qkvlab.experiments.registry import ResultsPending, runs_of
from qkvlab.experiments.store import DEFAULT_DB, FINISHED, Store, canonical, run_id
from qkvlab.experiments.tensorboard import RunLogger, check_available
from qkvlab.experiments.timing import format_breakdown, sum_parts
from qkvlab.models import count_params
from qkvlab.progress import bar as progress_bar
from qkvlab.train import RunSpec, run_from_spec

BACKENDS = ("local", "ray")

# Local worker processes when none is asked for: one-thread workers, up to two. On 2 cores,
# two one-thread workers swept 24 quick runs in 134-137 s against 181-202 s for one worker
# with two threads (AMD EPYC, 2026-11-25): these small models do not split well over threads.
DEFAULT_WORKERS = min(2, os.cpu_count() or 1)


def execute(spec: RunSpec | Mapping[str, Any], run_dir: Path, *, on_log=None,
            progress: bool = False, desc: str = "run") -> dict[str, Any]:
    """Train one spec (resuming from ``run_dir``) and return what the store records.

    Returns:
        ``{status, step, final, history, info}`` where ``info`` holds timings (``wall_s``,
        ``train_s`` and ``timings``, the trainer's seconds per part), parameter counts,
        tokens/s, versions, hardware and git revision, and ``precision_used`` (the precision
        the run trained in: bf16 may fall back to fp32 on a CPU). The store keeps
        ``precision_used`` inside the ``hardware`` JSON (``info["hardware"]["precision_used"]``),
        since it is the hardware's answer to the requested precision, and ``threads`` (the
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
    res = run_from_spec(spec, run_dir=run_dir, on_log=on_log, callback_factory=factory,
                        progress=progress, desc=desc)
    if res.status == "done":  # the optimizer state is only needed to resume an unfinished run
        (run_dir / "checkpoint.safetensors").unlink(missing_ok=True)
    env = environment()
    env["hardware"] = {**env["hardware"], "precision_used": res.precision_used}
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


def _logger(store: Store, rid: str, spec: Mapping[str, Any], tensorboard: str | None,
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
         spawned: float | None = None) -> int:
    """Worker loop: claim and run each id not finished or taken; returns how many it ran.

    ``spawned``: the ``time.time()`` at which the sweep started this process; the seconds
    until here (interpreter start, imports) are recorded as ``startup`` of its first run.
    """
    startup = max(0.0, time.time() - spawned) if spawned is not None else 0.0
    if parent is not None:
        _die_with_parent(parent)
    torch.set_num_threads(threads)
    ran = 0
    t = time.perf_counter()
    with Store(db) as store:
        by = f"{socket.gethostname()}:{parent}" if parent is not None else store.trainer
        for rid in ids:
            if not store.claim(rid, by=by):
                continue
            spec = store.runs_spec(rid)
            # store time so far (opening it, claims lost to other workers) goes to this run
            spent = {"store": time.perf_counter() - t}
            close = None
            if run_id(spec) != rid:  # the id is the spec's hash: never train another spec
                store.fail(rid, f"run {rid}: the spec stored under this id hashes to "
                                f"{run_id(spec)}; the store was changed by hand, not trained")
                ran += 1
                continue
            try:
                on_log, close = _logger(store, rid, spec, tensorboard, spent)
                out = execute(spec, store.runs_dir / rid, progress=progress, desc=rid[:8],
                              on_log=on_log)
                t = time.perf_counter()
                store.finish(rid, out["status"], out["step"], out["final"], out["info"])
                store.record_timings(rid, _run_timings(out["info"]["timings"], spent, startup,
                                                       time.perf_counter() - t))
                startup = 0.0
            except Exception:  # one bad config must not stop the sweep; the store keeps the trace
                store.fail(rid, traceback.format_exc())
            finally:
                if close is not None:
                    close()
            ran += 1
            t = time.perf_counter()
    return ran


def _run_timings(trained: Mapping[str, float], spent: Mapping[str, float], startup: float,
                 finish_s: float) -> dict[str, float]:
    """A run's timings as the store records them: the trainer's parts, with the store writes
    that happened inside ``on_log`` (``spent["log_store"]``) moved from ``log`` to ``store``,
    which also holds the worker's other store time (``spent["store"]``) and ``finish_s``."""
    in_log = spent.get("log_store", 0.0)
    return {**trained, "log": max(0.0, trained.get("log", 0.0) - in_log),
            "store": spent.get("store", 0.0) + in_log + finish_s, "startup": startup}


def experiment_names(name: str | Sequence[str]) -> list[str]:
    """The experiments ``name`` stands for: every registered one for ``all``, else itself; a
    list of names stands for each of them, in its order, each once.

    Raises:
        ValueError: a name is neither a registered experiment nor ``all``, or the list is empty.
    """
    names = [name] if isinstance(name, str) else list(name)
    if not names:
        raise ValueError("experiment: no name given")
    out: list[str] = []
    for n in names:
        registry.check_experiment(n)
        out += [e for e in (registry.experiment_names() if n == "all" else [n]) if e not in out]
    return out


def sweep_plan(name: str | Sequence[str], profile: str, *, workers: int = 1,
               backend: str = "local", store: Store | None = None) -> list[tuple[str, list]]:
    """Check a sweep's arguments and list its runs, before anything is written anywhere.
    ``store``: the results so far, for experiments whose runs depend on earlier ones
    (``registry.runs_of``).

    Returns:
        ``[(experiment, [(spec, tags), ...]), ...]`` in the order the sweep registers them.

    Raises:
        ResultsPending: an experiment needs another's results first.
        ValueError: unknown experiment, profile or backend, or a worker count below 1.
    """
    _check_pool(workers, backend)
    return [(n, runs_of(n, profile, store)) for n in experiment_names(name)]


def _check_pool(workers: int, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {list(BACKENDS)}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers: {workers!r} must be a positive integer")


def _stage(names: list[str], profile, store: Store | None
           ) -> tuple[list[tuple[str, list]], list[str], ResultsPending | None]:
    """The experiments of ``names`` whose runs can be listed from ``store`` now, with their
    runs; the others (their runs depend on results still to come); and the first reason."""
    plan, later, why = [], [], None
    for n in names:
        try:
            plan.append((n, runs_of(n, profile, store)))
        except ResultsPending as e:
            later.append(n)
            why = why or e
    return plan, later, why


def sweep_ids(name: str | Sequence[str], profile: str, store: Store | None = None) -> list[str]:
    """The run ids of experiment ``name`` (``all``, or a list of names) at ``profile``, in
    sweep order.

    Raises:
        ValueError: unknown experiment or profile.
    """
    ids: list[str] = []
    for _, runs in sweep_plan(name, profile, store=store):
        ids += [i for i in (run_id(spec) for spec, _ in runs) if i not in ids]
    return ids


def first_failure(store: Store, ids: Iterable[str]) -> str | None:
    """``"run <id>: <exception line>"`` for the first of ``ids`` whose status is ``failed``
    (the last line of the traceback the store keeps for it), or None if none failed."""
    for rid in ids:
        if store.status(rid) == "failed":
            lines = [ln.strip() for ln in (store.error(rid) or "").splitlines() if ln.strip()]
            return f"run {rid}: {lines[-1] if lines else '(no traceback recorded)'}"
    return None


def errors_command(name: str | Sequence[str], profile: str,
                   db: str | os.PathLike = DEFAULT_DB) -> str:
    """The command that prints the full traceback of every failed run of a sweep."""
    if not isinstance(name, str):  # several experiments: their results are among all's
        name = name[0] if len(name) == 1 else "all"
    cmd = ["qkvlab", "results", name, "--profile", profile, "--errors"]
    if Path(db) != Path(DEFAULT_DB):
        cmd += ["--db", str(db)]
    return shlex.join(cmd)


def failure_report(store: Store, name: str | Sequence[str], profile: str) -> str | None:
    """Why a sweep's runs failed, in two lines: the first failure's exception and the command
    that prints every traceback; None if no run of ``name`` at ``profile`` failed.

    Raises:
        ValueError: unknown experiment or profile.
    """
    first = first_failure(store, sweep_ids(name, profile, store))
    if first is None:
        return None
    return f"first failure: {first}\nfull tracebacks: {errors_command(name, profile, store.path)}"


def sweep(name: str | Sequence[str], profile: str = "quick", *, workers: int = 1,
          backend: str = "local", db: str | os.PathLike = DEFAULT_DB, progress: bool = True,
          threads: int | None = None, tensorboard: str | os.PathLike | None = None,
          log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Run experiment ``name`` (``all``, or a list of names) at ``profile`` into the store at
    ``db``.

    The named experiments train as one queue, so a worker that finishes its last run of one
    experiment goes on with the next instead of waiting for the others. An experiment whose
    runs depend on another's results (``registry.ResultsPending``: e.g. the rates ``lr_tune``
    chooses) waits for a later stage: each stage trains every run that can be listed from the
    results so far, and the next lists the rest from what it stored.

    Finished runs (done/diverged) are skipped; failed and orphaned ones are retried; a run
    that another live sweep holds is waited for, not repeated. ``tensorboard``: a folder
    where every run this sweep trains also logs its metrics for TensorBoard
    (``qkvlab.experiments.tensorboard``). Every argument is checked before the store is
    opened, so a bad one creates no database file. Runs that fail leave their traceback in
    the store: :func:`failure_report` (or :func:`first_failure` with :func:`sweep_ids`) says
    why, and ``qkvlab results NAME --profile P --errors`` prints them all.

    At the end of each stage, and of the sweep when it had several, where the wall time went
    for the runs it trained (model step, data, eval, checkpoints, ...; ``experiments.timing``)
    goes to ``log``, or to ``tqdm.write`` when ``log`` is None and ``progress`` is on.
    ``timing.time_breakdown`` reads it back.

    Returns:
        counts per status over the named experiments' runs.

    Raises:
        ResultsPending: experiments whose runs still cannot be listed once the others have
            trained (what they need failed); the others' results are stored.
        ValueError: unknown experiment, profile, backend or worker count.
    """
    began, t0 = time.time(), time.perf_counter()
    _check_pool(workers, backend)
    names = experiment_names(name)
    if Path(db).is_file():  # earlier results complete the plan of dependent experiments
        with Store(db, readonly=True) as known:
            plan, later, why = _stage(names, profile, known)
    else:
        plan, later, why = _stage(names, profile, None)
    if not plan:
        raise why
    profile = getattr(profile, "name", profile)  # a registry Profile or its name
    if tensorboard is not None:
        check_available()  # one clear error now, not one failed run per config
        tensorboard = str(tensorboard)
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    pool = workers if backend == "local" else 1  # Ray runs overlap beyond the count
    write = log or (tqdm.write if progress else None)
    label = name if isinstance(name, str) else _label(names)
    with Store(db) as store:  # a bad --db fails here, before the bar is drawn
        bar = progress_bar(total=0, desc=f"sweep {label} [{profile}]", disable=not progress,
                           dynamic_ncols=True)
        ids: list[str] = []
        n_stages = 0
        while plan:
            n_stages += 1
            stage_began, t = time.time(), time.perf_counter()
            stage: list[str] = []
            for n, runs in plan:
                for i in store.add(n, profile, runs, replace=True):
                    if i not in stage:  # one run may be listed twice (a baseline in both arms)
                        stage.append(i)
            ids += [i for i in stage if i not in ids]
            bar.total = len(ids)
            _train(store, stage, ids, backend, workers, threads, bar, tensorboard)
            if write is not None and (later or n_stages > 1):
                write(_breakdown(store, f"sweep {_label([n for n, _ in plan])} [{profile}]",
                                 stage, stage_began, time.perf_counter() - t, pool))
            if not later:
                break
            plan, later, why = _stage(later, profile, store)
            if not plan:
                bar.close()
                raise why
        bar.close()
        if write is not None:
            write(_breakdown(store, f"sweep {label} [{profile}]", ids, began,
                             time.perf_counter() - t0, pool))
        return status_counts(store, ids)


def status_counts(store: Store, ids: Iterable[str]) -> dict[str, int]:
    """How many of the runs ``ids`` the store holds in each status."""
    counts: dict[str, int] = {}
    for i in ids:
        s = store.status(i)
        counts[s] = counts.get(s, 0) + 1
    return counts


def _label(names: Sequence[str]) -> str:
    """A sweep's title: its experiments' names, shortened when there are many."""
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]} ({len(names)})"


def _breakdown(store: Store, title: str, ids: list[str], since: float, wall_s: float,
               workers: int) -> str:
    """Where the wall time went for the runs of ``ids`` this sweep trained since ``since``
    (a concurrent sweep's runs into the same store are its own)."""
    trained = store.timings(ids, since=since, by=store.trainer)
    parts = sum_parts(trained.values(), wall_s=wall_s, workers=workers)
    return format_breakdown(title, parts, runs=len(trained), wall_s=wall_s, workers=workers)


def _train(store: Store, ids: list[str], counted: list[str], backend: str, workers: int,
           threads: int, bar, tensorboard: str | None) -> None:
    """Train every run of ``ids`` not finished, until each is finished or failed once here;
    ``bar`` counts the finished runs of ``counted``."""
    tried: set[str] = set()
    while True:
        store.reclaim()
        _show_finished(bar, store, counted)
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
            _local_pool(str(store.path), todo, workers, threads, bar, store, counted,
                        tensorboard)
        tried.update(todo)
    _show_finished(bar, store, counted)


def _show_finished(bar, store: Store, counted: list[str]) -> None:
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
                counted: list[str], tensorboard: str | None = None) -> None:
    ctx = mp.get_context("spawn")  # fork after torch's thread pools start is unsafe
    procs = []
    for k in range(workers):
        # each worker starts on its own share, then helps with the rest (claims keep it exact)
        p = ctx.Process(target=work, args=(db, todo[k::workers] + todo, threads, os.getpid()),
                        kwargs={"tensorboard": tensorboard, "spawned": time.time()}, daemon=False)
        p.start()
        procs.append(p)
    while any(p.is_alive() for p in procs):
        time.sleep(0.5)
        _show_finished(bar, store, counted)
    for p in procs:
        p.join()


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
            pending[remote.remote(store.runs_spec(rid), rid)] = rid
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        rid = pending.pop(done[0])
        try:
            out = ray.get(done[0])
            t = time.perf_counter()
            on_log, close = _logger(store, rid, store.runs_spec(rid), tensorboard)
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


def _ray_task(spec: Mapping[str, Any], rid: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:  # checkpoints live on the Ray node
        return execute(spec, Path(d) / rid)

