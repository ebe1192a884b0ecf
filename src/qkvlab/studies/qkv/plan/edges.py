"""Following a learning-rate choice past its grid's edge, shared by every tuning family
(``rates`` for lr_tune and the placements, ``uptrain``, ``headwidth``, ``scaling``): a choice on
an end of its grid trains the next point out, and the next while the newest point wins, at most
``EDGE_STEPS`` points. Each family says what its grid step is (``past``) and where its losses
come from (``mean``); this module only decides which points to train and what is chosen.
"""

from __future__ import annotations


# How far a choice on a grid's edge is followed outward: the first point past it, and the next
# while the newest point wins, at most this many points: three grid steps (×8 on a ×2 grid)
# bound what one choice can add to a profile's runs, and a choice still on the last point is
# flagged in the report rather than followed for ever.
EDGE_STEPS = 3


def argmin(lrs, mean) -> float:
    """The rate of ``lrs`` with the lowest ``mean``; ties go to the smaller rate."""
    return min(sorted(set(lrs)), key=mean)


def seed_mean(losses: list[float | None] | None) -> float | None:
    """The mean of one rate's tuning-seed losses (infinite for a diverged run), None while
    one has not finished or none is listed: ``follow_edge``'s ``mean`` for one rate."""
    return None if not losses or None in losses else sum(losses) / len(losses)


def follow_edge(best: float, past, mean) -> tuple[list[float], float | None]:
    """Follow a grid's choice past the grid's edge.

    Args:
        best: the choice on the grid.
        past: ``past(k)``, the k-th rate beyond ``best``'s end of the grid (k = 1, 2, ...);
            None where ``best`` is inside the grid.
        mean: ``mean(lr)``, the mean val loss at ``lr`` over the tuning seeds (infinite where
            one diverged), None while one has not finished.

    Returns:
        the points past the edge to train (the first; the next only once the newest has
        finished and won; at most ``EDGE_STEPS``), and the choice over ``best`` and those
        points (ties to the smaller rate), None while one of them has not finished.
    """
    points: list[float] = []
    for k in range(1, EDGE_STEPS + 1):
        lr = past(k)
        if lr is None:
            break
        points.append(lr)
        if mean(lr) is None:
            return points, None
        if argmin([best, *points], mean) != lr:  # the choice is back inside
            break
    return points, argmin([best, *points], mean)
