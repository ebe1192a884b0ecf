"""Findings the verdict sentences word, each decided here rather than in render: symmetry
emerging in the encoder against the decoder, the scale probe at init, the folded alt model,
and the mean ± CI of a set of seeds (render formats a ``SeedSummary``; it computes none).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from qkvlab.stats import decide, mean_ci, paired
from qkvlab.studies.qkv.compute.frames import emergence_series, probe_at, records
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan.vocab import METRICS


@dataclass(frozen=True)
class Emergence:
    """The encoder's and the decoder's symmetry at the end of training (``emergence_series``),
    and, where both have the same seeds, the paired difference encoder − decoder decided against
    the symmetry margin (``stats.decide``: ``status`` worse/better/equivalent/undecided; better =
    the encoder more symmetric); ``status`` None with fewer than two pairs."""
    n_enc: int
    n_dec: int
    enc: list
    dec: list
    diff: float | None = None
    half: float | None = None
    status: str | None = None
    seeds: int | None = None   # seeds that would decide it, where undecided
    margin: float = 0.0


def emergence(data: StudyData) -> Emergence | None:
    ser = emergence_series(data)
    if "encoder" not in ser or "decoder" not in ser:
        return None
    n_enc, n_dec = max(ser["encoder"]), max(ser["decoder"])  # each at the end of its training
    enc, dec = ser["encoder"][n_enc], ser["decoder"][n_dec]
    out = Emergence(n_enc, n_dec, enc, dec, margin=METRICS["symmetry"].margin)
    if len(enc) == len(dec) and len(enc) >= 2:  # same seeds: paired, encoder − decoder
        d = paired(enc, dec)
        v = decide(d["diff"], d["diff_sd"], d["n_pairs"], out.margin, lower_is_better=False)
        out = dataclasses.replace(out, diff=d["diff"], half=v["half"], status=v["status"],
                                  seeds=v["seeds"])
    return out


SATURATION_MARGIN = 0.05  # a share of saturated rows that counts as more (5 points)


@dataclass(frozen=True)
class ScaleInit:
    """The scale probe at init, at the widest d_k probed: per placement the seeds' saturated
    row shares, normalized entropies and ‖∇W_Q‖ (``probe_at``), and what they say:
    ``saturates`` (None: not both measured) — 'none' saturates more rows than 'inside' by more
    than ``SATURATION_MARGIN``; ``grad_shrinks`` — then 'none' also reaches W_Q with a smaller
    mean gradient; ``outer_saturates`` — 'outside' saturates more than 'inside' as well."""
    dk: int
    sat: dict
    ent: dict
    grad: dict
    saturates: bool | None
    grad_shrinks: bool | None
    outer_saturates: bool | None


def scale_init(probe: list[dict]) -> ScaleInit | None:
    if not probe:
        return None
    sat, grad = probe_at(probe, "saturated", 0), probe_at(probe, "grad_WQ", 0)
    ent = probe_at(probe, "norm_entropy", 0)
    if not sat:
        return None
    dk = max(k[1] for k in sat)
    at = lambda d, k: {p: v for (p, w), v in d.items() if w == k}  # noqa: E731
    sat, ent, grad = at(sat, dk), at(ent, dk), at(grad, dk)
    mean = {k: mean_ci(sat.get(k, []))["mean"] for k in ("inside", "outside", "none")}
    g = {k: mean_ci(grad.get(k, []))["mean"] for k in ("inside", "none")}
    ok = lambda *xs: all(x == x and abs(x) != float("inf") for x in xs)  # noqa: E731
    saturates = (mean["none"] > mean["inside"] + SATURATION_MARGIN
                 if ok(mean["none"], mean["inside"]) else None)
    return ScaleInit(
        dk, sat, ent, grad, saturates,
        grad_shrinks=(g["none"] < g["inside"] if saturates and ok(g["none"]) else None),
        outer_saturates=(mean["outside"] > mean["inside"] + SATURATION_MARGIN
                         if saturates and ok(mean["outside"]) else None))


@dataclass(frozen=True)
class Fold:
    """``fold_alt`` on the trained alt models: the largest logit difference in fp64 and fp32,
    the largest logit, the parameters saved, the seeds' speed ratios folded/alt, ``exact`` (the
    fp64 difference within 1e-9 of the logits' size), and ``faster``: the folded model is
    faster with its 95% CI over seeds above 1 (None with one seed: no CI)."""
    d64: float
    d32: float
    scale: float
    saved: int
    speeds: list
    exact: bool
    faster: bool | None


def fold(data: StudyData) -> Fold | None:
    f = records(data.measure("fold_alt"))
    if not f:
        return None
    d64 = max(r["max_abs_diff_fp64"] for r in f)
    scale = max(r["max_abs_logit"] for r in f)
    speeds = [r["speed_folded_vs_alt"] for r in f]
    m = mean_ci(speeds)
    return Fold(d64, max(r["max_abs_diff_fp32"] for r in f), scale,
                int(f[0]["params_alt"] - f[0]["params_folded"]), speeds,
                exact=d64 <= 1e-9 * max(scale, 1.0),
                faster=None if m["n"] < 2 or m["half"] != m["half"] else
                bool(m["mean"] - m["half"] > 1.0))


@dataclass(frozen=True)
class SeedSummary:
    """Mean over seeds, the half-width of its 95% CI (NaN for one seed) and the count."""
    mean: float
    half: float
    n: int


def seed_summary(values) -> SeedSummary:
    m = mean_ci(list(values))
    return SeedSummary(m["mean"], m["half"], m["n"])
