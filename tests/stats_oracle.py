"""Statistics the study's tests check against, computed here from numpy and scipy's t
distribution alone, independently of ``qkvlab.stats``."""

from __future__ import annotations

import numpy as np
from scipy import stats as st


def t_interval(d) -> tuple[float, float, float, float]:
    """Mean of ``d``, its 95% t interval (lo, hi) and the two-sided one-sample t-test's p."""
    d = np.asarray(d, dtype=float)
    sd = d.std(ddof=1)
    h = st.t.ppf(0.975, len(d) - 1) * sd / np.sqrt(len(d))
    with np.errstate(divide="ignore", invalid="ignore"):  # seeds that agree exactly: sd 0
        p = 2 * st.t.sf(abs(d.mean()) / (sd / np.sqrt(len(d))), len(d) - 1)
    return d.mean(), d.mean() - h, d.mean() + h, p
