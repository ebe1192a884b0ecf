"""The study's profiles: model sizes, seeds, per-task options and training, measure sizes and
the learning-rate grid, from ``smoke`` (every experiment end to end in CI, seconds) through
``quick`` (``make report``: the report's numbers on a 2-core CPU in minutes), ``standard`` (the
questions decided on a 2-core CPU) to ``full`` (GPU sizes).

Any change to a profile's sizes changes the run ids, so stored results of the old settings are
simply not reused. Before changing a quick setting, check that standard attention still learns
the synthetic tasks well above chance over several seeds and that ``make report`` stays within
15 minutes on a 2-core CPU. How each profile was sized, with the measurements behind it, is in
docs/study-profiles.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qkvlab.experiments.registry import Profile, register_profile
from qkvlab.hf.convert import ConvertConfig
from qkvlab.hf.cost import CostConfig
from qkvlab.studies.qkv.plan.vocab import LM_VOCAB


@dataclass(frozen=True)
class Rates:
    """What the study reads back from the store before it plans the runs that depend on it
    (``plan.experiments.read_rates``, registered as the profiles' preparer), never a size:

    - ``lrs``: the rates ``lr_tune`` chose, ``{(task, design, arm): rate}``, and the final
      choices of ``scale_tune``/``scale_tune_edge``,
      ``{(task, placement, arm, d_head, init): rate}``;
    - ``scale_edge_points``: per key of ``scale_tune``, the rates past its grid's edge that
      ``edges.follow_edge`` has reached (the plan of ``scale_tune_edge``; () inside the
      grid); ``lr_edge_points``: ``lr_tune``'s (the plan of ``lr_tune_edge``);
    - ``scaling_tuned``: run id -> (status, final val loss) of the scaling tuning runs;
    - ``stored``: run id -> (status, final val loss) of every stored run, where the profile
      converts its own lm (``plan.uptrain``: a conversion waits for its parent) or tunes
      the head-width cells' rates (``plan.headwidth``).

    None: not read (the profile tunes nothing there, or no store was given).
    """

    lrs: Mapping[tuple, float] | None = None
    scale_edge_points: Mapping[tuple, tuple[float, ...]] | None = None
    lr_edge_points: Mapping[tuple, tuple[float, ...]] | None = None
    scaling_tuned: Mapping[str, tuple[str, float | None]] | None = None
    stored: Mapping[str, tuple[str, float | None]] | None = None


@dataclass(frozen=True)
class QKVProfile(Profile):
    """A profile with this study's extra sizes: the scale probe's head widths, steps and
    seeds, the key/value bits of the width-price task and its seeds (empty: the profile's),
    the measures' sizes (evaluation batch, speed rounds, decode length, null sample of the
    pretrained analysis and whether it runs the models on text for CKA), and the
    learning-rate grid.

    Learning rates: with an empty ``lr_grid`` every design trains at the task's rate. Otherwise
    experiment ``lr_tune`` trains each design of ``questions.tuned_designs()`` in each arm its
    comparisons run (``rates.tuned_arms``) at ``lr_grid`` × the task's rate on ``lr_seeds``
    (disjoint from ``seeds``), and the comparisons train each (design, arm) at the rate with
    the lowest mean validation loss over those seeds (read from the store into ``rates``; a
    diverged run counts as infinite loss; ties go to the smaller rate). The parameter-matched
    arm is a model of another width, so it gets its own rate; standard's matched arm is its
    equal-width run. The reported numbers come from the other seeds.
    """

    probe_d_heads: tuple[int, ...] = ()
    probe_steps: int = 4
    probe_seeds: tuple[int, ...] = (0,)
    bind_bits: tuple[int, ...] = ()  # m of bind_codes: key and value bits per item
    bind_seeds: tuple[int, ...] = ()
    measure_batch: int = 8
    rounds: int = 3
    decode_tokens: int = 16
    n_null: int = 32
    cka: bool = False
    # Q3's payoff curve (measure kv_decode): decode step tokens/s per cache layout at these
    # contexts and batches (empty: not measured); quick stays within ~30 s on 2 cores
    kv_contexts: tuple[int, ...] = ()
    kv_batches: tuple[int, ...] = (1,)
    lr_grid: tuple[float, ...] = ()
    lr_seeds: tuple[int, ...] = ()
    scale_widths: tuple[int, ...] = ()
    scale_seeds: tuple[int, ...] = ()
    # Q1's scale in training (experiment scale_train): lm with 1/√d_k inside, outside, both,
    # none and none + T5's init at these head widths, each split as d_model // d_head heads
    # (each must divide d_model), from the model's own and a unit-variance init, on these
    # seeds (empty: not run)
    scale_train_d_heads: tuple[int, ...] = ()
    scale_train_seeds: tuple[int, ...] = ()
    # per task: the seeds and arms of its design comparisons (absent: the profile's seeds and
    # both arms; no seeds: the task is left out), so a budget can give diagnostics fewer
    # seeds than real text
    task_seeds: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    task_arms: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # What each tie costs a trained decoder (``qkvlab.hf.cost``): the zoo's decoder LMs
    # measured, the ties also measured one layer at a time, and the sizes (None: not measured)
    tie_cost: CostConfig | None = None
    tie_cost_models: tuple[str, ...] = ()
    tie_cost_per_layer: tuple[str, ...] = ()
    # the models measured one layer at a time (empty: every model of tie_cost_models)
    tie_cost_per_layer_models: tuple[str, ...] = ()
    # pretrained decoders converted to a tie and uptrained (qkvlab.hf.convert), each config on
    # each model of convert_models
    convert: tuple[ConvertConfig, ...] = ()
    convert_models: tuple[str, ...] = ()
    # the uptraining rate, chosen per model on val among these (``qkvlab.hf.rate``) for the first
    # config of ``convert``; every other config of that model trains at it (empty: each
    # config's own ``uptrain.lr``)
    convert_lr_grid: tuple[float, ...] = ()
    # and with it W_O's basis among these (``hf.rate.choose``; K=V's fitted start only; empty:
    # the config's own)
    convert_o_bases: tuple[str, ...] = ()
    # The controlled conversion (``plan.uptrain``): the standard lm converted to tied K=V and
    # trained these fractions of its steps more (empty: not run), at the rate chosen from
    # uptrain_lr_grid (× the parent's rate) on lr_seeds where the profile tunes rates
    uptrain_fractions: tuple[float, ...] = ()
    uptrain_lr_grid: tuple[float, ...] = ()
    # K = V's head-width axis (``plan.headwidth``): lm at each (d_model, n_heads), n_heads ×
    # d_head = d_model, standard, K = V, GQA-half and the control (empty: not run)
    head_width_cells: tuple[tuple[int, int], ...] = ()
    # The gap against training budget and size (``plan.scaling``; empty: not run): steps of
    # the budget cells and their seeds; widths and depths of the size cells, the tokens each
    # trains on per non-embedding parameter and their seeds; the rate grid (× lm's rate) and
    # its seeds
    scaling_budgets: tuple[int, ...] = ()
    scaling_seeds: tuple[int, ...] = ()
    size_widths: tuple[int, ...] = ()
    size_depths: tuple[int, ...] = ()
    tokens_per_param: float = 20.0
    size_seeds: tuple[int, ...] = ()
    # (width, depth) size cells held out of the tuning for the size trend's back-test
    # (``compute.backtest``): trained like the other size cells on ``size_seeds``, each design
    # at the rate chosen in the largest tuned size cell of the same depth (never tuned itself)
    size_holdout: tuple[tuple[int, int], ...] = ()
    scaling_lr_grid: tuple[float, ...] = ()
    scaling_lr_seeds: tuple[int, ...] = ()
    # what the store holds of the tuning experiments, read before the runs that depend on them
    rates: Rates = Rates()


# Task options per profile: short contexts and small vocabularies keep CPU runs in seconds.
# mlm trains on 16-character windows with 30% masking: on 64 it never leaves the context-free
# plateau (at init a bidirectional head gives the neighbours that predict a masked character
# 1/64 of its attention). bind and relation are sized so that standard learns them to ~100%,
# so a tied design's shortfall is a cost of the tie, not of the budget.
# lm (the headline) is byte-level BPE trained on the train split, so its perplexity is per
# subword token as in the papers; 1,024 symbols: at d_model 64 the tied embedding (65k) stays
# below the ~98k non-embedding parameters and a token spans ~3 characters (vocab.LM_VOCAB). Its
# 64 tokens span ~190 characters. lm_char is the old character-level lm, a second row.
BPE_LM = {"tokenizer": "bpe", "vocab_size": LM_VOCAB}
TASK_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"lm": {"seq_len": 32, **BPE_LM}, "lm_char": {"seq_len": 32}, "mlm": {"seq_len": 32},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 8, "decode_batch": 8},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 16, "n_values": 8, "group_size": 4, "n_items": 8, "n_queries": 2},
              "bind_codes": {"n_queries": 2},
              "relation": {"vocab": 16, "n_context": 16, "n_queries": 8},
              "successor": {"vocab": 16, "n_items": 6},
              "successor_causal": {"vocab": 16, "n_items": 6}},
    "quick": {"lm": {"seq_len": 64, **BPE_LM}, "lm_char": {"seq_len": 64},
              "mlm": {"seq_len": 16, "mask_prob": 0.3},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 32, "decode_batch": 32},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8, "n_queries": 4},
              "bind_codes": {"n_queries": 4},
              "relation": {"vocab": 32, "n_context": 12, "n_queries": 11},
              "successor": {"vocab": 32, "n_items": 8},
              "successor_causal": {"vocab": 32, "n_items": 8}},
    "standard": {"lm": {"seq_len": 64, **BPE_LM}, "lm_char": {"seq_len": 64},
                 "mlm": {"seq_len": 16, "mask_prob": 0.3},
                 "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 100,
                               "decode_batch": 50},
                 "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
                 "bind": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8,
                          "n_queries": 4},
                 "bind_codes": {"n_queries": 4},
                 "relation": {"vocab": 32, "n_context": 12, "n_queries": 11},
                 "successor": {"vocab": 32, "n_items": 8},
                 "successor_causal": {"vocab": 32, "n_items": 8}},
    "full": {"lm": {"seq_len": 256, **BPE_LM}, "lm_char": {"seq_len": 256},
             "mlm": {"seq_len": 128}, "translate": {"seq_len": 128},
             "mqar": {"seq_len": 128, "n_pairs": 16},
             "bind": {"n_keys": 64, "n_items": 32, "n_queries": 8},
             "bind_codes": {"n_queries": 8},
             "relation": {"n_context": 64, "n_queries": 32},
             "successor": {"vocab": 64, "n_items": 32},
             "successor_causal": {"vocab": 64, "n_items": 32}},
}

# Training per task and profile (TrainConfig fields), over the profile's steps/lr/batch_size:
# bind's plateau needs large batches, relation (induction) lr 1e-3, translate 300 steps before
# the decoder leaves unigram statistics; lm and mlm evaluate every quarter at standard, so the
# report can show the val loss at half the budget.
TASK_TRAIN: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"translate": {"steps": 4}, "mqar": {"lr": 1e-2}, "bind": {"lr": 1e-2},
              "bind_codes": {"lr": 1e-2},
              "relation": {"lr": 1e-2}, "successor": {"lr": 1e-2},
              "successor_causal": {"lr": 1e-2}},
    "quick": {"lm": {"steps": 100}, "lm_char": {"steps": 100},
              "translate": {"steps": 300, "eval_every": 150},
              "mqar": {"steps": 300, "lr": 1e-2, "batch_size": 32},
              "bind": {"steps": 800, "lr": 3e-3, "batch_size": 128},
              "bind_codes": {"steps": 800, "lr": 3e-3, "batch_size": 128},
              "relation": {"steps": 400, "lr": 1e-3, "batch_size": 32},
              "successor": {"steps": 500, "batch_size": 32},
              "successor_causal": {"steps": 500, "batch_size": 32}},
    "standard": {"lm": {"lr": 6e-3, "eval_every": 250},
                 "lm_char": {"lr": 6e-3, "eval_every": 250},
                 "mlm": {"steps": 1500, "eval_every": 375},
                 "translate": {"steps": 600, "eval_every": 300},
                 "mqar": {"steps": 600, "lr": 1e-2, "batch_size": 32},
                 "bind": {"steps": 800, "lr": 3e-3, "batch_size": 128},
                 "bind_codes": {"steps": 800, "lr": 3e-3, "batch_size": 128},
                 "relation": {"steps": 600, "lr": 1e-3, "batch_size": 32},
                 "successor": {"steps": 1000, "batch_size": 32},
                 "successor_causal": {"steps": 1000, "batch_size": 32}},
    "full": {"mqar": {"steps": 3000}, "bind": {"steps": 3000}, "bind_codes": {"steps": 3000},
             "relation": {"steps": 3000},
             "successor": {"steps": 3000}, "successor_causal": {"steps": 3000}},
}

# lm_char is a second row beside the headline lm: equal width only (lm carries the matched arm)
CHAR_ARMS = {"lm_char": ("equal",)}
# The scaling profile's lm: subword tokens, so its gaps are in the papers' unit (per token).
SCALING_LM = {"lm": {"tokenizer": "bpe", "vocab_size": 1024, "seq_len": 64}}

PROFILES = {p.name: register_profile(p) for p in (
    QKVProfile("smoke", seeds=(0,), d_model=32, n_layers=1, n_heads=2, batch_size=8, steps=6,
               lr=3e-3, eval_batches=1, task_options=TASK_OPTIONS["smoke"],
               task_train=TASK_TRAIN["smoke"], probe_d_heads=(16, 64), probe_steps=4,
               probe_seeds=(0,), bind_bits=(1,), measure_batch=8, rounds=3,
               decode_tokens=16, n_null=32, cka=False, scale_widths=(16, 32),
               scale_train_d_heads=(8, 16), scale_train_seeds=(0,),
               kv_contexts=(64, 256), kv_batches=(1, 2), task_arms=CHAR_ARMS,
               scaling_budgets=(4, 8), scaling_seeds=(0, 1), size_widths=(16, 32),
               size_holdout=((64, 1),),
               size_depths=(1,), tokens_per_param=0.02, size_seeds=(0,),
               scaling_lr_grid=(1.0, 3.0), scaling_lr_seeds=(100,), uptrain_fractions=(0.5,)),
    # 15 minutes on 2 cores (docs/study-profiles.md): at quick's budgets standard does not
    # beat the attention-free control on lm, lm_char or translate, and mlm is not learned, so
    # those rows decide nothing: lm and lm_char run as a smoke test on 2 seeds and half their
    # steps (TASK_TRAIN), translate and mlm not at all (smoke runs both, standard mlm), nor do
    # the head-width axis and the controlled conversion (lm only, the kv profile's); the
    # tasks quick decides (relation, successor, the width price) keep their seeds and budgets.
    QKVProfile("quick", seeds=(0, 1), d_model=64, n_layers=2, n_heads=4, batch_size=16,
               steps=200, lr=3e-3, eval_batches=8, task_options=TASK_OPTIONS["quick"],
               task_train=TASK_TRAIN["quick"], probe_d_heads=(16, 64, 256),
               probe_steps=60, probe_seeds=(0,), bind_bits=(3,),
               # 4 seeds: with 2, K=V's ~20-point loss at d_head = m had a t(1) interval
               # of ±32 points, so Q3's one trained headline quick can afford stayed open
               bind_seeds=(0, 1, 2, 3), measure_batch=16, rounds=5, decode_tokens=48,
               n_null=128, cka=True,
               task_seeds={"mqar": (), "translate": (), "mlm": (), "relation": (0, 1, 2),
                           "successor": (0, 1, 2), "successor_causal": (0, 1, 2)},
               scale_train_d_heads=(16, 64), scale_train_seeds=(0, 1),
               kv_contexts=(512, 2048, 8192), kv_batches=(1, 8),
               task_arms={**CHAR_ARMS, "relation": ("equal",), "mlm": ("equal",),
                          "bind_codes": ("equal",)},
               tie_cost=CostConfig(), tie_cost_models=("smollm2",),
               # a cheap point of the conversion curve: where K=V's fitted and Kayyam's
               # averaged start begin, and one uptraining step (the convert profile's curve)
               convert=tuple(ConvertConfig(tie="kv", start=s, tokens=1024, eval_tokens=4096,
                                           calib_tokens=2048) for s in ("fitted", "avg")),
               convert_models=("smollm2",),
               # no head-width axis and no controlled conversion (uptrain_fractions): both
               # train lm only, where quick decides nothing; the kv profile answers them
               ),
    QKVProfile("standard", seeds=tuple(range(8)), d_model=64, n_layers=2, n_heads=4,
               batch_size=16, steps=1000, lr=3e-3, eval_batches=16,
               task_options=TASK_OPTIONS["standard"], task_train=TASK_TRAIN["standard"],
               probe_d_heads=(16, 32, 64, 128, 256), probe_steps=60, probe_seeds=(0, 1, 2),
               bind_bits=(2, 3, 4), bind_seeds=(0, 1, 2, 3), measure_batch=16,
               rounds=5, decode_tokens=48, n_null=128, cka=True,
               kv_contexts=(512, 2048, 8192, 32768), kv_batches=(1, 4, 16),
               # no lm_scaling: the gap against size at matched data is the scaling profile's
               # (its widths all trained 1,000 steps, so tokens per parameter fell with width)
               # 1/3, 1 and 3 x each task's rate, a choice on an edge followed outward
               # (rates.lr_tune_edge): of the 51 rates the 4-point grid with 9 chose at
               # 2026-11-29, none was 9, 21 were 3 (docs/study-profiles.md, "standard")
               lr_grid=(1 / 3, 1.0, 3.0), lr_seeds=(100,),
               # ~8,700 CPU-s with its tuning (docs/study-profiles.md); 6 seeds: an
               # equivalent cell then survives Holm over Q1's family at a paired sd of ~1%
               scale_train_d_heads=(16, 64), scale_train_seeds=tuple(range(6)),
               # no translate: at 600 steps its control is level with standard (+1.1 ± 5.6%),
               # so none of its ~3,750 estimated worker-seconds could decide a cell (smoke and
               # full keep it); K=V's head-width axis and the controlled conversion are the
               # kv profile's (below): with them standard was ~4.7 h on 2 cores, estimated
               # (docs/study-profiles.md, "standard")
               # lm_char, the second row beside the per-token lm, on 6 of the 8 seeds
               task_seeds={"mqar": (), "translate": (), "relation": (0, 1, 2),
                           "successor": tuple(range(4)), "successor_causal": tuple(range(4)),
                           "lm_char": tuple(range(6))},
               task_arms={**CHAR_ARMS, "mlm": ("equal",)},
               # every decoder zero-shot, SmolLM2 also one layer at a time (with every layer
               # the three took 198, 236 and 481 s on the 2-core EPYC, 2026-11-24)
               tie_cost=CostConfig(), tie_cost_per_layer=("kv",),
               tie_cost_per_layer_models=("smollm2",),
               tie_cost_models=("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")),
    QKVProfile("full", seeds=(0, 1, 2, 3, 4), d_model=384, n_layers=6, n_heads=6, batch_size=64,
               steps=5000, lr=1e-3, eval_batches=50, task_options=TASK_OPTIONS["full"],
               task_train=TASK_TRAIN["full"], probe_d_heads=(16, 32, 64, 128, 256),
               probe_steps=1000, probe_seeds=(0, 1, 2), bind_bits=(2, 4, 8, 16),
               scale_train_d_heads=(16, 64, 128), scale_train_seeds=(0, 1, 2),
               measure_batch=32, rounds=7, decode_tokens=128, n_null=256, cka=True,
               task_arms=CHAR_ARMS,
               kv_contexts=(512, 2048, 8192, 32768), kv_batches=(1, 4, 16),
               tie_cost=CostConfig(eval_tokens=8192, calib_tokens=8192),
               tie_cost_per_layer=("kv", "qk"),
               tie_cost_models=("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b",
                                "qwen2.5-coder-1.5b"),
               scaling_budgets=(1000, 2000, 4000, 8000), scaling_seeds=tuple(range(6)),
               size_widths=(128, 192, 256, 384), size_depths=(2, 4), size_seeds=(0, 1, 2),
               tokens_per_param=20.0, scaling_lr_grid=(0.5, 1.0, 2.0), scaling_lr_seeds=(100,)),
    # Only the gap against training budget and size (``plan.scaling``), on the subword lm:
    # no seeds of its own, so every other experiment lists no runs. Sized for <= 3 h on 2
    # cores (docs/study-profiles.md, "scaling").
    # Only pretrained decoders converted to a tie and uptrained by distillation (qkvlab.hf.convert):
    # K=V from the fitted start and from Kayyam et al.'s naive ones, against the untied model
    # uptrained the same way; GQA/MQA from Ainslie et al.'s mean-pooling; Q=K and Q=K=V at the
    # small budgets; every arm at the rate chosen on val for K=V's fitted start (which chooses
    # its W_O basis there too). Measured from a fresh clone: ~2 h 36 min on 2 idle cores, 3 h 10
    # min with tests beside it (docs/study-profiles.md, "convert").
    QKVProfile("convert", seeds=(), d_model=64, n_layers=2, n_heads=4, batch_size=16,
               steps=1000, lr=3e-3, eval_batches=16, task_options=SCALING_LM,
               convert=(*(ConvertConfig(tie=t, start=s, tokens=262144)
                          for t, s in (("kv", "fitted"), ("kv", "avg"), ("none", None))),
                        *(ConvertConfig(tie=t, start=s, tokens=16384)
                          for t, s in (("kv", "keep_k"), ("mqa", None), ("qk", None),
                                       ("qkv", None)))),
               convert_models=("smollm2",), convert_lr_grid=(3e-5, 1e-4, 3e-4),
               # W_O's basis chosen with the rate (hf.rate.choose): the folded W_O' took a
               # step that diverged Qwen2.5-Coder at its untied model's rate (docs/convert.md)
               convert_o_bases=("tied", "untied")),
    # K=V on the study's own lm, at standard's sizes, seeds and rate grid (so its lm runs are
    # standard's, shared in one store): the head-width axis and the controlled conversion,
    # with the lm tuning and comparisons they start from. Sized for <= 3 h on 2 cores
    # (docs/study-profiles.md, "kv"); lr_tune tunes the lm designs these experiments compare.
    QKVProfile("kv", seeds=tuple(range(8)), d_model=64, n_layers=2, n_heads=4,
               batch_size=16, steps=1000, lr=3e-3, eval_batches=16,
               task_options=TASK_OPTIONS["standard"], task_train=TASK_TRAIN["standard"],
               lr_grid=(1 / 3, 1.0, 3.0), lr_seeds=(100,), task_arms=CHAR_ARMS,
               task_seeds={t: () for t in TASK_OPTIONS["standard"] if t != "lm"},
               experiments=("lr_tune", "lr_tune_edge", "lm_tied_kv", "lm_gqa", "uptrain_tune",
                            "uptrain_tune_edge", "lm_convert", "head_width_tune",
                            "head_width_tune_edge", "head_width"),
               # the controlled conversion at 1%, 5% and 20% of lm's 1,000 steps, each start's
               # uptraining rate chosen on val of lr_seeds; the grid reaches 0.01: on
               # (0.1, 0.3, 1) and its step past the edge (0.033), the fitted start at 1% and
               # the untied model at 1% and 5% still chose the smallest rate (2026-11-26)
               uptrain_fractions=(0.01, 0.05, 0.2), uptrain_lr_grid=(0.01, 0.03, 0.1, 0.3, 1.0),
               # K=V's head-width axis: d_head 8, 16, 32, 64 at lm's width 64, and d_head 64
               # at width 128 (Kayyam et al.'s d_head at twice the width)
               head_width_cells=((64, 8), (64, 4), (64, 2), (64, 1), (128, 2))),
    QKVProfile("scaling", seeds=(), d_model=64, n_layers=2, n_heads=4, batch_size=16,
               steps=1000, lr=6e-3, eval_batches=16, task_options=SCALING_LM,
               scaling_budgets=(375, 750, 1500, 3000), scaling_seeds=tuple(range(6)),
               size_widths=(32, 48, 64, 80), size_depths=(1, 2), tokens_per_param=20.0,
               # the back-test's held-out cell: 112 × 2 (7 heads, ~302k parameters) is >= 3x
               # every cell up to 64 × 2 (~99k), the fit's four sizes where attention is used
               # (docs/study-profiles.md, "scaling")
               size_holdout=((112, 2),),
               size_seeds=(0, 1, 2), scaling_lr_grid=(0.5, 1.0, 2.0), scaling_lr_seeds=(100,)),
)}
