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
from qkvlab.studies.qkv.plan.references import (
    KAYYAM_RERUN_KV_PCT,
    REF_KV_CHARS_PER_TOKEN,
    REF_KV_TOKENIZER,
)


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
            return {"n_kv_heads": half_kv(p.n_heads)}
        return dict(self.options)


def half_kv(n_heads: int) -> int:
    """GQA-half's kv heads: n_heads / 2, or where that is no whole divisor of n_heads (an odd
    count) the largest divisor below it, so 3 and 5 heads share one kv head (MQA, the same run
    as ``mqa``'s: its spec and so its id are the same) and 9 share 3."""
    return max([k for k in range(1, n_heads // 2 + 1) if n_heads % k == 0], default=1)


# Okabe-Ito colors (readable by colour-blind readers), one per design.
DESIGNS: dict[str, Design] = {d.name: d for d in (
    Design("standard", "standard", "#000000"),
    Design("alt", "alt (4th matrix)", "#D55E00", {"design": "alt"}),
    Design("tied_qk", "tied Q=K", "#0072B2", {"design": "tied_qk"}),
    Design("tied_qk_selfmask", "tied Q=K + self-mask", "#56B4E9",
           {"design": "tied_qk", "self_mask": True}),
    Design("tied_qkv", "Q=K=V", "#CC79A7", {"design": "tied_qkv"}),
    Design("tied_qkv_selfmask", "Q=K=V + self-mask", "#E3AECF",
           {"design": "tied_qkv", "self_mask": True}),
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
                 "none": "#CC79A7", "none_t5": "#E69F00", "encoder": "#0072B2",
                 "decoder": "#D55E00", "cross": "#009E73"}
# Where 1/√d_k sits in scale_train, in words (inside is standard: ``plan.placements``)
PLACEMENT_LABELS = {"outside": "1/√d_k outside", "both": "1/√d_k inside and outside",
                    "none": "no 1/√d_k", "none_t5": "no 1/√d_k, T5 init (W_Q/√d_k)"}
ARMS = {"equal": "equal width", "matched": "parameter-matched"}

# The design groups the experiments, tables and figures share.
SCALED = ("alt", "tied_qk", "tied_qkv", "tied_kv", "gqa_half")  # lm_scaling's designs
KV_DESIGNS = ("standard", "tied_kv", "gqa_half")  # same KV cache question, in drawing order
CONTROL = "control"  # a comparison is decided only where standard beats it (compute.effects)


def color(key: str) -> str:
    """A design's color (or a scale placement's, or a role's); grey for anything else."""
    d = DESIGNS.get(key)
    return d.color if d is not None else OTHER_COLORS.get(key, "#777777")


def label(design: str) -> str:
    d = DESIGNS.get(design)
    return d.label if d is not None else PLACEMENT_LABELS.get(design, design)


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
    column: str = ""
    digits: int = 1  # decimals of a shown difference

    @property
    def stored(self) -> str:
        """The metric of the runs' results this row reads (its own name unless ``column``)."""
        return self.column or self.name

    @property
    def halved(self) -> float:
        """The raw change that halves perplexity (a lower-is-better loss: ln 2 nats, 1 bit):
        the "not learned" guard's step below a context-free guess."""
        return 1.0 if self.name.startswith("bits") else math.log(2)

    @property
    def raw_margin(self) -> float:
        """The margin in the metric's own units (nats for a loss, a fraction for accuracy)."""
        return self.to_raw(self.margin)

    @property
    def margin_text(self) -> str:
        return f"±{self.margin:g}{self.unit}"


# The headline lm's tokenizer: byte-level BPE of LM_VOCAB symbols trained on the Bible's train
# split (KJV + WEB). 1,024: at d_model 64 its tied embedding (65k parameters) stays below the
# model's ~98k non-embedding ones, and a token spans ~3 characters (GPT-2's, which Kayyam
# et al. use, ~4 on English web text); 512 spans 2.3, 2,048 3.6 but outweighs the model
# (docs/study-profiles.md).
LM_VOCAB = 1024
# Characters per token of that tokenizer on the val split (401,983 / 132,435, measured by
# ``qkvlab.data`` 2026-11-25; a test re-measures it): converts a per-token ratio r to r^(1/c)
# per character.
LM_CHARS_PER_TOKEN = 3.035
# translate's target tokens (its own BPE of 1,000 symbols, profiles.TASK_OPTIONS): 200,868
# characters in 81,571 scored target tokens of the val split (2026-11-25).
TRANSLATE_CHARS_PER_TOKEN = 2.46
# The headline margin: per-token perplexity of the BPE lm, in % (METRICS["val_loss"]). ±1%:
# its anchor is the smallest published cost of tied K=V trained from scratch, Kayyam et al.'s
# corrected rerun, +2.2% per GPT-2 token of ~4 characters, which is 1.022^(3.035/4) − 1 = 1.7%
# per our token: inside ±2% (the margin until 2026-11-26), so an effect of the published size
# could have read "equivalent". ±1% keeps it outside, with room for the ~4 being ~5.
TOKEN_MARGIN_PCT = 1.0
# The published anchor per our token and per target token (``references``; per character
# r^(1/c), per token of c' characters r^(c'/c)).
KAYYAM_PER_TOKEN = 100.0 * ((1 + KAYYAM_RERUN_KV_PCT / 100) ** (LM_CHARS_PER_TOKEN
                                                                 / REF_KV_CHARS_PER_TOKEN) - 1)
_R = 1.0 + TOKEN_MARGIN_PCT / 100.0  # the margin as a per-token ratio
# The same margin per character: ±1% per token is log(1.01)/c nats, log2(1.01)/c bits, per char.
CHAR_MARGIN_NATS = math.log1p(TOKEN_MARGIN_PCT / 100.0) / LM_CHARS_PER_TOKEN
CHAR_MARGIN_BITS = CHAR_MARGIN_NATS / math.log(2)


def ppl_pct(nats):
    """A log-loss difference (nats) as % perplexity, 100·(e^Δ − 1): the one conversion every
    table, sentence and figure uses. A number goes through ``math.expm1``, an array or Series
    through ``np.expm1`` (they differ in the last bit for some inputs, and each output keeps
    the one it has always used, bit for bit)."""
    if isinstance(nats, (int, float)):
        return 100.0 * math.expm1(nats)
    import numpy as np
    return 100.0 * np.expm1(nats)


def ppl_nats(pct: float) -> float:
    """The inverse of :func:`ppl_pct`: a % perplexity as nats."""
    return math.log1p(pct / 100.0)


_char_pct = ppl_pct


# The per-character margin per translate target token, and the published anchor per target
# token: the reason translate's margin is true in its unit.
TARGET_MARGIN_PCT = _char_pct(CHAR_MARGIN_NATS * TRANSLATE_CHARS_PER_TOKEN)
_KAYYAM_PER_TARGET = 100.0 * ((1 + KAYYAM_RERUN_KV_PCT / 100) ** (TRANSLATE_CHARS_PER_TOKEN
                                                                  / REF_KV_CHARS_PER_TOKEN) - 1)


# Written down before the runs (science standards): each metric's margin and why; in this order
# in the margins table and the legend. ``column``: the stored metric a row reads when it is not
# its own name (mlm's loss is stored as val_loss, judged per masked character).
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("val_loss", True, TOKEN_MARGIN_PCT, "% perplexity per subword token",
           f"lm, per subword token (byte-level BPE of {LM_VOCAB:,}, {LM_CHARS_PER_TOKEN} "
           f"characters a token): below the +{KAYYAM_RERUN_KV_PCT}% per-token perplexity that "
           "tied K=V costs at 300M parameters in Kayyam et al.'s corrected rerun (2026; +3.1% "
           "in their slides), which per our token is "
           f"{1 + KAYYAM_RERUN_KV_PCT / 100:g}^({LM_CHARS_PER_TOKEN}/"
           f"{REF_KV_CHARS_PER_TOKEN:g}) − 1 = {KAYYAM_PER_TOKEN:.1f}% ({REF_KV_TOKENIZER}, "
           f"~{REF_KV_CHARS_PER_TOKEN:g} characters a token), so an effect of that size reads "
           "'worse', never 'equivalent'",
           "perplexity", "%", ppl_pct, ppl_nats),
    Metric("bits_per_char", True, round(CHAR_MARGIN_BITS, 4), "bits per character",
           f"the headline's ±{TOKEN_MARGIN_PCT:g}% per subword token, per character: a "
           "per-token ratio r is r^(1/c) per character at c characters a token, so "
           f"±log2({_R:g})/c bits per "
           f"character at lm's c = {LM_CHARS_PER_TOKEN} (±{CHAR_MARGIN_BITS:.4f}); a "
           "character-level effect inside it would be inside the per-token margin",
           "", " bits/char", _identity, digits=3),
    Metric("masked_loss", True, round(_char_pct(CHAR_MARGIN_NATS), 2),
           "% perplexity per masked character",
           f"mlm is scored per masked character: the headline's ±{TOKEN_MARGIN_PCT:g}% per "
           f"subword token spread over lm's {LM_CHARS_PER_TOKEN} characters a token "
           f"({_R:g}^(1/c) − 1 = "
           f"{_char_pct(CHAR_MARGIN_NATS):.2f}%), the decoder's standard held per character; "
           "no masked-LM tie cost is published to anchor it otherwise",
           "masked-character perplexity", "%", ppl_pct, ppl_nats, column="val_loss"),
    Metric("target_loss", True, round(TARGET_MARGIN_PCT, 2), "% perplexity per target token",
           "translate is scored per target token of its own BPE (1,000 symbols, "
           f"{TRANSLATE_CHARS_PER_TOKEN} characters a German target token): lm's "
           f"±{TOKEN_MARGIN_PCT:g}% per token held per character is "
           f"{_R:g}^({TRANSLATE_CHARS_PER_TOKEN}/{LM_CHARS_PER_TOKEN}) − 1 = "
           f"{TARGET_MARGIN_PCT:.2f}% per target token, below the {_KAYYAM_PER_TARGET:.1f}% per "
           f"target token that tied K=V's published +{KAYYAM_RERUN_KV_PCT}% per "
           f"~{REF_KV_CHARS_PER_TOKEN:g}-character token would be, so an effect of that size "
           "reads 'worse'",
           "perplexity", "%", ppl_pct, ppl_nats, column="val_loss"),
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

# task -> the metric its comparisons are judged on. Real-text tasks on their loss in their own
# unit (lm per subword token, translate per target token of its own BPE, lm_char in bits per
# character, mlm per masked character), synthetic ones on accuracy at the queried positions
# (chance-level loss says little there).
TASK_METRIC = {"lm": "val_loss", "lm_char": "bits_per_char", "mlm": "masked_loss",
               "translate": "target_loss",
               "mqar": "accuracy", "relation": "accuracy", "bind": "accuracy",
               "bind_codes": "accuracy", "successor": "accuracy", "successor_causal": "accuracy"}


# every task's own loss row (the evidence tables show these besides accuracy, chrF, BLEU)
TEXT_LOSSES = ("val_loss", "bits_per_char", "masked_loss", "target_loss")


# Which split each number comes from: the learning rates and every other choice (the rate grid,
# the "trained how far" budget) read ``val``; every reported comparison reads the run's
# ``test`` metrics, which the trainer scores once on the final model (``test_<metric>``, data
# no choice saw). Throughput is a property of the run, not scored on a split.
CHOICE_SPLIT, REPORTED_SPLIT = "val", "test"
UNSPLIT = frozenset({"tokens_per_s"})


def reported(metric: str) -> str:
    """The stored final-metric key a reported comparison reads for ``metric``: the stored
    metric its row names (``Metric.stored``: mlm's ``masked_loss`` is stored as ``val_loss``),
    scored on the test split (``test_val_loss``); a run property such as throughput is itself."""
    if metric in UNSPLIT:
        return metric
    row = METRICS.get(metric)
    return f"{REPORTED_SPLIT}_{row.stored if row is not None else metric}"


def metric_of(name: str) -> Metric | None:
    """The row of a compared metric; any other loss is read as val loss; None if unknown."""
    if name in METRICS:
        return METRICS[name]
    return METRICS["val_loss"] if "loss" in name else None


def lower_is_better(metric: str) -> bool:
    m = metric_of(metric)
    return True if m is None else m.lower_is_better
