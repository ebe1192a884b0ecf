"""The share of attention's benefit a design gives up: written down before the runs it reads.

A raw gap to standard mixes two things: what the tie costs, and what attention is worth at that
budget (the attention-free control's gap). Read as a share of the control's gap, a tie that
costs +14.8% where the control costs +16.4% gives up about all of what attention buys; one that
costs +3% where the control costs +30% gives up a tenth.

Per seed, on the task's own metric at equal width: (design − standard) / (control − standard),
the three runs of one seed, lost runs at the value their comparison enters them with
(``stats.compare``'s rule). For a loss that is ln(1 + gap) / ln(1 + control's gap), since a gap
in % perplexity is exp(Δ loss) − 1. Its mean over seeds and 95% t interval (``stats.mean_ci``).
It is read only where standard beats the control (``effects.attention_used``): elsewhere the
denominator is noise. ``reading`` turns the interval into words:

- ``none_kept``: the interval holds 100% and not 0%: indistinguishable from no attention;
- ``all_kept``: it holds 0% and not 100%: indistinguishable from standard;
- ``part``: it lies between 0% and 100%: the design keeps part of the benefit;
- ``below_control``: wholly above 100%: worse than no attention at all;
- ``above_standard``: wholly below 0%: better than standard;
- ``undecided``: it holds both 0% and 100%, or it has fewer than two seeds.
"""

from __future__ import annotations

import math

LEVEL = 0.95
READINGS = ("none_kept", "part", "all_kept", "below_control", "above_standard", "undecided")


def reading(lo: float, hi: float) -> str:
    """The ``READINGS`` key of a share's interval [lo, hi] (fractions: 1 = the control's gap)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    has0, has1 = lo <= 0.0 <= hi, lo <= 1.0 <= hi
    if has0 and has1:
        return "undecided"
    if has1:
        return "none_kept"
    if has0:
        return "all_kept"
    if lo > 1.0:
        return "below_control"
    if hi < 0.0:
        return "above_standard"
    return "part"
