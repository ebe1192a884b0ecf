"""The study's vocabulary: every design it compares and every metric it judges, as frozen rows.

A design row holds what the runs are tagged with (``name``), what the page calls it, its color
in every figure and the model options that build it. A metric row holds which way is better,
the unit people quote it in, and its practical margin with the reason, fixed before the runs.
Everything else (experiments, effects, tables, figures, sentences) reads these rows, so a name,
a color or a margin changes in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qkvlab.experiments.registry import Profile


@dataclass(frozen=True)
class Design:
    """One compared design: its tag in the runs, display name, color and model options."""

    name: str
    label: str
    color: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def model_options(self, p: Profile) -> dict[str, Any]:
        """Model options at a profile: GQA's kv heads follow the profile's head count."""
        if self.name == "gqa_half":
            return {"n_kv_heads": max(1, p.n_heads // 2)}
        return dict(self.options)


# Okabe-Ito colors (readable by colour-blind readers), one per design.
DESIGNS: dict[str, Design] = {d.name: d for d in (
    Design("standard", "standard", "#000000"),
    Design("alt", "alt (4th matrix)", "#D55E00", {"design": "alt"}),
    Design("tied_qk", "tied Q=K", "#0072B2", {"design": "tied_qk"}),
    Design("tied_qk_selfmask", "tied Q=K + self-mask", "#56B4E9",
           {"design": "tied_qk", "self_mask": True}),
    Design("tied_qkv", "Q=K=V", "#CC79A7", {"design": "tied_qkv"}),
    Design("tied_kv", "tied K=V", "#009E73", {"design": "tied_kv"}),
    Design("gqa_half", "GQA (n_kv = n_heads/2)", "#E69F00"),  # n_kv_heads per profile
    Design("mqa", "MQA (n_kv = 1)", "#B39B00", {"n_kv_heads": 1}),  # Okabe-Ito yellow, darkened
    Design("tied_kv_cross", "tied K=V (cross)", "#009E73",
           {"roles": {"cross": {"design": "tied_kv"}}}),
    Design("alt_identity", "alt, W_h = √d_k·I at init", "#F0A070",
           {"design": "alt", "mix_init": "identity"}),  # alt = standard at step 0
    # the control: attention with fixed uniform scores (no Q, K), trained beside every
    # comparison; why uniform and not a zero output: qkvlab.attention.designs.UniformAttention
    Design("control", "no attention (uniform)", "#999999", {"design": "uniform"}),
)}
# Colors of what the figures draw besides designs: where 1/√d_k sits, and attention roles.
OTHER_COLORS = {"inside": "#0072B2", "outside": "#D55E00", "both": "#009E73",
                 "none": "#CC79A7", "encoder": "#0072B2", "decoder": "#D55E00",
                 "cross": "#009E73"}
ARMS = {"equal": "equal width", "matched": "parameter-matched"}

# The design groups the experiments, tables and figures share.
TIED_QK = ("tied_qk", "tied_qk_selfmask", "tied_qkv")
SCALED = ("alt", "tied_qk", "tied_qkv", "tied_kv", "gqa_half")  # lm_scaling's designs
KV_DESIGNS = ("standard", "tied_kv", "gqa_half")  # same KV cache question, in drawing order
CONTROL = "control"  # a comparison is decided only where standard beats it (compute.effects)
SPEED_DESIGNS = ("alt", "tied_qk", "tied_qk_selfmask", "tied_qkv", "tied_kv", "gqa_half")


def color(key: str) -> str:
    """A design's color (or a scale placement's, or a role's); grey for anything else."""
    d = DESIGNS.get(key)
    return d.color if d is not None else OTHER_COLORS.get(key, "#777777")


def label(design: str) -> str:
    d = DESIGNS.get(design)
    return d.label if d is not None else design


def _identity(x: float) -> float:
    return x


@dataclass(frozen=True)
class Metric:
    """A metric and how a paired difference in it is read.

    ``margin`` (in ``margin_unit``, with its ``reason``) is the practical margin: differences to
    standard inside it do not matter for the question, so a 90% CI inside it reads
    "equivalent" (a TOST at 5%). A comparable metric also has ``show`` (raw difference -> the
    unit people quote, ``unit``), ``to_raw`` (its inverse, for the margin) and ``field``
    (``diff``, or ``rel`` for the per-seed relative % of the compare row). ``gated``: a
    quality the model learns, so its verdicts wait for standard to beat the attention-free
    control (``compute.effects.attention_used``); throughput is not learned.
    """

    name: str
    lower_is_better: bool
    margin: float
    margin_unit: str
    reason: str
    what: str = ""
    unit: str = ""
    show: Callable[[float], float] | None = None
    to_raw: Callable[[float], float] = _identity
    field: str = "diff"
    gated: bool = True

    @property
    def raw_margin(self) -> float:
        """The margin in the metric's own units (nats for a loss, a fraction for accuracy)."""
        return self.to_raw(self.margin)

    @property
    def margin_text(self) -> str:
        return f"±{self.margin:g}{self.unit}"


# Written down before the runs (science standards): each metric's margin and why; in this order
# in the margins table and the legend.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("val_loss", True, 2.0, "% perplexity",
           "below the +3.1% perplexity that tied K=V costs at 300M–1.2B parameters (Kayyam et "
           "al. 2026), so an effect of that size reads 'worse', never 'equivalent'; at a loss "
           "of 2 nats it is 1% of the loss",
           "perplexity", "%", lambda x: 100.0 * math.expm1(x), lambda v: math.log1p(v / 100.0)),
    Metric("accuracy", False, 2.0, "pp",
           "diagnostic tasks are compared only where standard learns them well above chance; "
           "a design within 2 points of it has the capacity the task tests",
           "accuracy", " pp", lambda x: 100.0 * x, lambda v: v / 100.0),
    Metric("chrf", False, 1.0, "chrF",
           "1 point on chrF's 0–100 scale is about 3% of the chrF ≥ 30 that translation is "
           "trained to, in line with the loss margin",
           "chrF", " points", _identity),
    Metric("bleu", False, 1.0, "BLEU",
           "1 BLEU point, the same share of a usable score as chrF's margin; BLEU is reported "
           "beside chrF (sacrebleu) but chrF is the one the verdicts quote",
           "BLEU", " points", _identity),
    Metric("symmetry", False, 0.05, "symmetry score",
           "a seventh of the encoder–decoder gap published for pretrained models (BERT-base "
           "0.51 vs GPT-2 0.15, Saponati et al. 2025): a smaller difference would not "
           "reproduce that finding"),
    Metric("tokens_per_s", False, 5.0, "%",
           "training throughput of one run varies by several per cent between runs on a "
           "shared CPU",
           "tokens/s", "%", _identity, field="rel", gated=False),
)}

# task -> the metric its comparisons are judged on. Real-text tasks on val loss, synthetic ones
# on accuracy at the queried positions (chance-level loss says little there).
TASK_METRIC = {"lm": "val_loss", "mlm": "val_loss", "translate": "val_loss",
               "mqar": "accuracy", "relation": "accuracy", "bind": "accuracy",
               "bind_codes": "accuracy", "successor": "accuracy", "successor_causal": "accuracy"}


# Which split each number comes from: the learning rates and every other choice (the rate grid,
# the "trained how far" budget) read ``val``; every reported comparison reads the run's
# ``test`` metrics, which the trainer scores once on the final model (``test_<metric>``, data
# no choice saw). Throughput is a property of the run, not scored on a split.
CHOICE_SPLIT, REPORTED_SPLIT = "val", "test"
UNSPLIT = frozenset({"tokens_per_s"})


def reported(metric: str) -> str:
    """The stored final-metric key a reported comparison reads for ``metric``: its score on
    the test split (``test_val_loss`` for ``val_loss``); a run property such as throughput is
    itself."""
    return metric if metric in UNSPLIT else f"{REPORTED_SPLIT}_{metric}"


def metric_of(name: str) -> Metric | None:
    """The row of a compared metric; any other loss is read as val loss; None if unknown."""
    if name in METRICS:
        return METRICS[name]
    return METRICS["val_loss"] if "loss" in name else None


def lower_is_better(metric: str) -> bool:
    m = metric_of(metric)
    return True if m is None else m.lower_is_better
