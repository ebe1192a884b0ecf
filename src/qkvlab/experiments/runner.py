"""``sweep``: run every config of named experiments into the results store.

The store is the work queue. The sweep registers the experiments' runs (id = hash of spec)
and trains them where ``experiments.pool`` says (this process, ``workers`` processes, or Ray
tasks); each worker (``experiments.worker``) *claims* runs atomically in SQLite, so two sweeps
of the same experiment (or overlapping experiments) share the work instead of repeating it,
and a run whose worker died resumes from its last checkpoint at the next sweep. Here: which
runs a sweep trains and in which stages, the sweep itself, and what it reports (counts per
status, the first failure, where the time went).
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tqdm.auto import tqdm

from qkvlab.experiments import registry
from qkvlab.experiments.pool import check_pool, train_runs
from qkvlab.experiments.registry import ResultsPending, runs_of
from qkvlab.experiments.store import DEFAULT_DB, Store, run_id
from qkvlab.experiments.tensorboard import check_available
from qkvlab.experiments.timing import format_breakdown, sum_parts
from qkvlab.progress import bar as progress_bar
from qkvlab.train.build import allow_task_modules


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
    check_pool(workers, backend)
    return [(n, runs_of(n, profile, store)) for n in experiment_names(name)]



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


def _grown(plan: list[tuple[str, list]], profile, store: Store, ids: list[str]) -> list[str]:
    """The experiments of ``plan`` whose runs, listed again from what the stage stored, include
    runs not trained yet: those that grow with their own results (a rate choice followed past
    its grid's edge one step at a time, ``edges.follow_edge``)."""
    known, out = set(ids), []
    for n, _ in plan:
        try:
            again = runs_of(n, profile, store)
        except ResultsPending:
            continue
        if any(run_id(spec) not in known for spec, _ in again):
            out.append(n)
    return out


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
          log: Callable[[str], None] | None = None,
          task_modules: Sequence[str] = ()) -> dict[str, int]:
    """Run experiment ``name`` (``all``, or a list of names) at ``profile`` into the store at
    ``db``.

    The named experiments train as one queue, so a worker that finishes its last run of one
    experiment goes on with the next instead of waiting for the others. An experiment whose
    runs depend on another's results (``registry.ResultsPending``: e.g. the rates ``lr_tune``
    chooses) waits for a later stage: each stage trains every run that can be listed from the
    results so far, and the next lists the rest from what it stored. An experiment whose runs
    grow with its own results (a rate followed past its grid's edge) is listed again after
    its stage, until it lists nothing new.

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
    ``timing.time_breakdown`` reads it back. ``task_modules``: modules whose ``module:Class``
    tasks the runs may name (``train.allow_task_modules``, passed on to the workers); a
    spec naming any other module fails without an import.

    Returns:
        counts per status over the named experiments' runs.

    Raises:
        ResultsPending: experiments whose runs still cannot be listed once the others have
            trained (what they need failed); the others' results are stored.
        ValueError: unknown experiment, profile, backend, worker or thread count.
    """
    began, t0 = time.time(), time.perf_counter()
    check_pool(workers, backend, threads)
    allow_task_modules(*task_modules)
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
            for _, runs in plan:  # a stored spec changed by hand: refused before any write
                for spec, _tags in runs:
                    if store.status(rid := run_id(spec)) is not None:
                        store.runs_spec(rid)
            for n, runs in plan:
                for i in store.add(n, profile, runs, replace=True):
                    if i not in stage:  # one run may be listed twice (a baseline in both arms)
                        stage.append(i)
            ids += [i for i in stage if i not in ids]
            bar.total = len(ids)
            train_runs(store, stage, ids, backend, workers, threads, bar, tensorboard)
            if write is not None and (later or n_stages > 1):
                write(_breakdown(store, f"sweep {_label([n for n, _ in plan])} [{profile}]",
                                 stage, stage_began, time.perf_counter() - t, pool))
            grown = _grown(plan, profile, store, ids)
            if not later and not grown:
                break
            plan, later, why = _stage(grown + later, profile, store)
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


