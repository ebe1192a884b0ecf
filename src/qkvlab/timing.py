"""How qkvlab times code: one timer, interleaved rounds, and the ratio between two contenders.

Speed figures (the library's, the bench's, the study's measures) go through here, so they all
time alike: :func:`seconds` and :func:`rate` wait for the device before and after the calls
(CUDA kernels return before they finish), :func:`interleaved_rounds` runs contenders
round-robin so that machine noise hits them alike, and :func:`ratio_stats` reads the paired
rounds of two contenders as a verdict (faster, slower, level or undecided).

A leaf: imports nothing from qkvlab but the leaf ``qkvlab.stats`` (lazily, so importing the
timer does not load scipy). Not to be confused with ``qkvlab.experiments.timing``, which
breaks a sweep's wall time down into its parts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["SPEED_MARGIN", "VERDICT_WORDS", "interleaved", "interleaved_rounds", "rate",
           "ratio_stats", "seconds", "sync"]


def sync(device) -> None:
    """Wait for the work queued on ``device``: CUDA kernels run asynchronously, so a timer
    must not stop before they finish; on the CPU this does nothing."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _elapsed(fn: Callable[[], object], iters: int, device) -> float:
    """Seconds that ``iters`` calls of ``fn`` take, the device synced before and after."""
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return time.perf_counter() - t


def seconds(fn: Callable[[], object], iters: int = 1, device="cpu") -> float:
    """Seconds per call of ``fn``, timed over ``iters`` calls on ``device`` (synced before and
    after, not between the calls)."""
    return _elapsed(fn, iters, device) / iters


def rate(fn: Callable[[], object], work: float = 1, iters: int = 1,
         device="cpu") -> Callable[[], float]:
    """A timer for :func:`interleaved`: each call of it runs ``fn`` ``iters`` times on
    ``device`` and returns ``work`` per second (``work``: what one call of ``fn`` does, e.g.
    its tokens; 1 gives calls per second)."""
    return lambda: work * iters / _elapsed(fn, iters, device)


def interleaved_rounds(fns: dict[str, Callable[[], float]], rounds: int,
                       alternate: bool = False) -> dict[str, list[float]]:
    """Each fn's returned figure (a rate, or seconds) per round, contenders run round-robin
    after one warm-up call each, so machine noise hits all contenders alike.

    ``alternate``: odd rounds run the contenders in reverse order, so each pair runs in both
    orders equally often (with an even ``rounds``). Where many contenders share a round, the
    later of two consecutive ones can run faster for its place alone: in the KV-decode sweep
    (``models.speed.kv_decode_speed``) the same step read 7-10% faster second than first, either
    way round (2-core Xeon, one thread), with or without an untimed call of its own first.
    """
    for fn in fns.values():
        fn()
    rates: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for i in range(rounds):
        for k in (order[::-1] if alternate and i % 2 else order):
            rates[k].append(fns[k]())
    return rates


def interleaved(fns: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of each fn's returned figure (see :func:`interleaved_rounds`)."""
    return {k: statistics.median(v) for k, v in interleaved_rounds(fns, rounds).items()}


# A speed ratio inside 1 ± SPEED_MARGIN reads "level": fixed before the runs, as the study's
# margins are. Single rounds on a 2-core VM spread by ±10-15%; nobody notices 5% on a training run.
SPEED_MARGIN = 0.05
VERDICT_WORDS = {"equivalent": "level", "better": "faster", "worse": "slower",
                 "undecided": "undecided"}


def ratio_stats(num: list[float], den: list[float]) -> dict:
    """Median, min and max over rounds of the per-round ratio num / den, and the verdict on it.

    The rounds are paired (interleaved), so the verdict is ``stats.decide`` on the
    per-round log ratios against ``ln(1 + SPEED_MARGIN)``: ``verdict`` is ``level`` (the 90%
    CI of the geometric-mean ratio inside 1 ± margin), ``faster``/``slower`` (its 95% CI
    excludes 1; num faster or slower than den), or ``undecided`` with ``rounds_needed`` (how
    many rounds the observed spread would need; None with one round). ``ci_lo``/``ci_hi``:
    the 95% CI of the geometric-mean ratio ``gmean``.
    """
    from qkvlab.stats import decide  # lazy: scipy loads only where a ratio is judged

    ratios = [a / b for a, b in zip(num, den)]
    r = sorted(ratios)
    logs = [math.log(x) for x in ratios]
    out = {"ratio": statistics.median(r), "min": r[0], "max": r[-1],
           "gmean": math.exp(statistics.fmean(logs))}
    if len(logs) < 2:  # no spread, no CI
        return {**out, "ci_lo": None, "ci_hi": None, "verdict": "undecided", "rounds_needed": None}
    d = decide(statistics.fmean(logs), statistics.stdev(logs), len(logs),
               math.log1p(SPEED_MARGIN), lower_is_better=False)
    return {**out, "ci_lo": math.exp(d["lo"]), "ci_hi": math.exp(d["hi"]),
            "verdict": VERDICT_WORDS[d["status"]], "rounds_needed": d["seeds"]}
