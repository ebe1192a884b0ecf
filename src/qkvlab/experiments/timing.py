"""Where a sweep's wall time goes: the parts of its runs, summed and shown as shares.

Every run a worker trains records its timings in the store (``Store.record_timings``): the
trainer's parts (``TrainResult.timings``: ``step``, ``data``, ``eval``, ``checkpoint``,
``log``, ``setup``) plus what the worker sees around it: ``store`` (claiming the run, its
per-step metrics and final row) and ``startup`` (a spawned worker's interpreter start and
imports, on the first run it trains). :func:`time_breakdown` sums them over some runs into
the parts of :data:`PARTS`; given the sweep's wall time, ``other`` is what no run accounts
for (planning, polling, runs that failed, a worker idle while the last run finishes). With
several workers the parts are worker-seconds and the shares are of ``workers × wall``.

What a fresh process pays once shows where it lands: a spawned worker's imports in
``start-up``; torch's own lazy import of ``torch._dynamo`` on the process's first optimizer
(about 1.5 s on a 2-core CPU) in its first run's ``setup``; the sweep process's planning
before it starts workers (matched arms build models on the meta device, which imports it
too) in ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qkvlab.experiments.store import Store

# Breakdown part -> the run timing keys it sums; the model step first, ``other`` last.
PARTS: dict[str, tuple[str, ...]] = {
    "model step": ("step",), "data": ("data",), "eval": ("eval",),
    "checkpoints": ("checkpoint",), "setup": ("setup",), "logging": ("log",),
    "store": ("store",), "start-up": ("startup",), "other": (),
}


def sum_parts(timings: Iterable[Mapping[str, float]], *, wall_s: float | None = None,
              workers: int = 1) -> dict[str, float]:
    """Seconds per breakdown part (:data:`PARTS`, in that order) summed over run timings.

    ``other`` is ``workers × wall_s`` less the rest (never below 0), or 0 without ``wall_s``.
    """
    totals = dict.fromkeys(PARTS, 0.0)
    for t in timings:
        for part, keys in PARTS.items():
            totals[part] += sum(max(0.0, float(t.get(k, 0.0))) for k in keys)
    if wall_s is not None:
        totals["other"] = max(0.0, workers * wall_s - sum(totals.values()))
    return totals


def time_breakdown(store: Store, ids: Iterable[str], *, since: float | None = None,
                   wall_s: float | None = None, workers: int = 1) -> dict[str, float]:
    """Seconds per part (:data:`PARTS`) over the runs of ``ids`` that recorded timings (and
    finished at or after ``since``, a ``time.time()``, if given): see :func:`sum_parts`."""
    return sum_parts(store.timings(ids, since).values(), wall_s=wall_s, workers=workers)


def format_breakdown(title: str, parts: Mapping[str, float], *, runs: int, wall_s: float,
                     workers: int = 1) -> str:
    """One summary line (the model step's share first), then one line per part.

    ``parts`` maps part names to seconds (:func:`time_breakdown`); shares are of
    ``workers × wall_s``, the time the workers had.
    """
    budget = workers * wall_s
    pool = f" on {workers} workers ({budget:.1f} worker-s)" if workers > 1 else ""
    head = f"{title}: {runs} run{'' if runs == 1 else 's'} trained in {wall_s:.1f} s{pool}"
    if runs == 0 or budget <= 0:
        return head

    def pct(s: float) -> str:
        return f"{100 * s / budget:.0f}%"
    rest = [n for n in parts if n != "model step"]
    line = " · ".join(f"{n} {pct(parts[n])}" for n in rest)
    if "model step" in parts:  # the number that matters stands apart, the rest in brackets
        line = f"model step {pct(parts['model step'])} ({line})"
    w = max(map(len, parts))
    rows = [f"  {n:<{w}} {parts[n]:7.1f} s {pct(parts[n]):>4}"
            for n in sorted(parts, key=lambda n: n != "model step")]
    return "\n".join([f"{head} — {line}", *rows])
