"""The three questions' experiments and profiles (registered on import).

Each experiment maps a claim from the threads in ``../shared/seeds/`` to runs; ``report`` in
this package reads their results back. Profiles: ``smoke`` (every experiment end to end in CI),
``quick`` (the report's numbers on a 2-core CPU in minutes, 3 seeds), ``full`` (GPU scale).
Any change to a profile's sizes changes the run ids, so stored results of the old settings are
simply not reused. Before changing a quick setting, check that standard attention still learns
the synthetic tasks well above chance over several seeds and that ``make report`` stays within
15 minutes on a 2-core CPU (DEVELOPERS.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qkvlab.data import get_task
from qkvlab.experiments.registry import (
    Profile,
    ResultsPending,
    Run,
    base_model,
    design_arms,
    experiment,
    make_run,
    matched,
    member_keys,
    register_profile,
    task_info,
)
from qkvlab.experiments.store import canonical
from qkvlab.hf.cost import CostConfig
from qkvlab.train import InitConfig, ProbeConfig


class RatesPending(ResultsPending):
    """A comparison's runs depend on the rates ``lr_tune`` chooses, and it has not finished."""


@dataclass(frozen=True)
class QKVProfile(Profile):
    """A profile with this study's extra sizes: the scale probe's head widths, steps and
    seeds, the key/value bits of the width-price task and its seeds (empty: the profile's),
    the measures' sizes (evaluation batch, speed rounds, decode length, null sample of the
    pretrained analysis and whether it runs the models on text for CKA), and the
    learning-rate grid.

    Learning rates: with an empty ``lr_grid`` every design trains at the task's rate. Otherwise
    experiment ``lr_tune`` trains each design of ``TUNED`` in each arm its comparisons run
    (``tuned_arms``) at ``lr_grid`` × the task's rate on ``lr_seeds`` (disjoint from
    ``seeds``), and the comparisons train each (design, arm) at the rate with the lowest mean
    validation loss over those seeds (``prepared`` reads it from the store into ``lrs``; a
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
    lr_grid: tuple[float, ...] = ()
    lr_seeds: tuple[int, ...] = ()
    scale_widths: tuple[int, ...] = ()
    scale_seeds: tuple[int, ...] = ()
    # per task: the seeds and arms of its design comparisons (absent: the profile's seeds and
    # both arms; no seeds: the task is left out), so a budget can give diagnostics fewer
    # seeds than real text
    task_seeds: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    task_arms: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # (task, design, arm) -> rate; see prepared
    lrs: Mapping[tuple[str, str, str], float] | None = None
    # What each tie costs a trained decoder (``qkvlab.hf.cost``): the zoo's decoder LMs
    # measured, the ties also measured one layer at a time, and the sizes (None: not measured)
    tie_cost: CostConfig | None = None
    tie_cost_models: tuple[str, ...] = ()
    tie_cost_per_layer: tuple[str, ...] = ()

    def prepared(self, store) -> QKVProfile:
        if not self.lr_grid or self.lrs is not None:
            return self
        return dataclasses.replace(self, lrs=chosen_lrs(self, store))

    def tuned_arms(self, task: str, label: str) -> tuple[str, ...]:
        """The arms whose rate ``lr_tune`` tunes for a design: those its comparisons run."""
        if label == "standard" or label in EQUAL_ONLY:
            return ("equal",)
        return tuple(self.task_arms.get(task, ("equal", "matched")))

    def design_lrs(self, task: str, designs, arms=("equal", "matched")
                   ) -> dict[tuple[str, str], float]:
        """``{(label, arm): learning rate}`` of ``standard`` and ``designs`` in ``arms`` on
        ``task`` (empty when every design trains at the task's rate).

        Raises:
            RatesPending: the profile tunes rates and ``lr_tune`` has not chosen them yet.
        """
        if not self.lr_grid or task not in TUNED:
            return {}
        lrs = self.lrs or {}

        def key(d: str, arm: str) -> tuple[str, str, str]:
            return (task, d, "equal" if d == "standard" else arm)
        want = [(d, arm) for arm in arms for d in ("standard", *designs)]
        missing = sorted({f"{d} ({key(d, a)[2]})" for d, a in want if key(d, a) not in lrs})
        if missing:
            raise RatesPending(
                f"profile {self.name}: {task} trains each design at the learning rate that "
                f"experiment lr_tune chose, and it has not finished for {missing}; run "
                f"`qkvlab sweep lr_tune --profile {self.name}` first (qkvlab study does)")
        return {(d, a): lrs[key(d, a)] for d, a in want}


# The designs each tuned task compares (model options per label), and so the learning-rate grid.
DESIGNS: dict[str, dict[str, Any]] = {
    "standard": {}, "alt": {"design": "alt"}, "tied_qk": {"design": "tied_qk"},
    "tied_qk_selfmask": {"design": "tied_qk", "self_mask": True},
    "tied_qkv": {"design": "tied_qkv"}, "tied_kv": {"design": "tied_kv"},
    "gqa_half": {},  # n_kv_heads = n_heads // 2, set per profile (design_options)
    "tied_kv_cross": {"roles": {"cross": {"design": "tied_kv"}}},
    "alt_identity": {"design": "alt", "mix_init": "identity"},  # alt = standard at step 0
}
TUNED = {"lm": ("alt", "tied_qk", "tied_qk_selfmask", "tied_qkv", "tied_kv", "gqa_half"),
         "mlm": ("tied_qk", "tied_qk_selfmask", "tied_qkv"),
         "translate": ("alt", "alt_identity", "tied_kv_cross")}
# designs compared at equal width only (lm_gqa, alt_init): no matched-width rate to tune
EQUAL_ONLY = frozenset({"gqa_half", "alt_identity"})


def design_options(label: str, p: Profile) -> dict[str, Any]:
    """Model options of a design label at a profile."""
    if label == "gqa_half":
        return {"n_kv_heads": max(1, p.n_heads // 2)}
    return dict(DESIGNS[label])


def chosen_lrs(p: QKVProfile, store) -> dict[tuple[str, str, str], float]:
    """``{(task, design, arm): rate}`` chosen from ``lr_tune``'s finished runs in ``store``
    (only the runs the profile's grid lists now: a store keeps those of earlier grids)."""
    listed = member_keys(lr_tune(p))
    return choose_lrs(p, ((r["tags"]["task"], r["tags"]["design"], r["tags"]["arm"],
                           r["tags"]["lr"], r["status"], r["final"].get("val_loss"))
                          for r in store.runs("lr_tune", p.name)
                          if (r["id"], canonical(r["tags"])) in listed))


def lr_of(task: str, mult: float, p: Profile) -> float:
    """A grid point: ``mult`` × the task's rate, to 3 significant digits (so the same rate is
    the same run id whichever multiplier reaches it)."""
    return float(f"{task_lr(task, p) * mult:.3g}")


def choose_lrs(p: QKVProfile, rows) -> dict[tuple[str, str, str], float]:
    """The rate with the lowest mean val loss over ``lr_seeds`` per (task, design, arm), from
    rows ``(task, design, arm, lr, status, val_loss)``; only designs whose whole grid has
    finished. A diverged run (or one without a loss) counts as infinite loss; ties go to the
    smaller rate."""
    scores: dict[tuple[str, str, str], dict[float, list[float]]] = {}
    for task, design, arm, lr, status, loss in rows:
        if status not in ("done", "diverged"):
            continue
        ok = status == "done" and loss is not None and math.isfinite(loss)
        scores.setdefault((task, design, arm), {}).setdefault(float(lr), []).append(
            loss if ok else math.inf)
    out = {}
    for key, by_lr in scores.items():
        grid = {lr_of(key[0], m, p) for m in p.lr_grid}
        if set(by_lr) == grid and all(len(v) == len(p.lr_seeds) for v in by_lr.values()):
            means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
            best = min(sorted(means), key=lambda lr: means[lr])
            if math.isfinite(means[best]):
                out[key] = best
    return out


def task_lr(task: str, p: Profile) -> float:
    """The learning rate a task trains at without tuning (its override, else the profile's)."""
    return float(p.task_train.get(task, {}).get("lr", p.lr))


# Task options per profile: short contexts and small vocabularies keep CPU runs in seconds.
# mlm on 64-character windows sits on the plateau of a context-free guess (val loss 2.78 at
# 1,000 and 2.75 at 2,400 steps, unigram entropy 3.04, at every rate from 1e-3 to 9e-3; 40%
# masking: 2.77): at init a bidirectional head spreads its attention over all 64 positions, so
# the neighbours that predict a masked character get 1/64 of it. On 16-character windows it
# takes off (seed 0, lr 3e-3, 15% masking: 2.35 at 1,000 steps; 30%: 2.26 at 1,000, 1.99 at
# 2,000), so mlm trains on 16 with 30% masking (Wettig et al. 2023: more masking trains faster).
# At quick sizes bind and relation are learned to ~100% by standard attention (measured over
# seeds; bigger key sets or a context that is the whole vocabulary stay at chance for
# thousands of steps), so a tied design's shortfall is a cost of the tie, not of the budget.
TASK_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"lm": {"seq_len": 32}, "mlm": {"seq_len": 32},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 8, "decode_batch": 8},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 16, "n_values": 8, "group_size": 4, "n_items": 8, "n_queries": 2},
              "bind_codes": {"n_queries": 2},
              "relation": {"vocab": 16, "n_context": 16, "n_queries": 8},
              "successor": {"vocab": 16, "n_items": 6},
              "successor_causal": {"vocab": 16, "n_items": 6}},
    "quick": {"lm": {"seq_len": 64}, "mlm": {"seq_len": 16, "mask_prob": 0.3},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 32, "decode_batch": 32},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8, "n_queries": 4},
              "bind_codes": {"n_queries": 4},
              "relation": {"vocab": 32, "n_context": 12, "n_queries": 11},
              "successor": {"vocab": 32, "n_items": 8},
              "successor_causal": {"vocab": 32, "n_items": 8}},
    "standard": {"lm": {"seq_len": 64}, "mlm": {"seq_len": 16, "mask_prob": 0.3},
                 "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 100,
                               "decode_batch": 50},
                 "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
                 "bind": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8,
                          "n_queries": 4},
                 "bind_codes": {"n_queries": 4},
                 "relation": {"vocab": 32, "n_context": 12, "n_queries": 11},
                 "successor": {"vocab": 32, "n_items": 8},
                 "successor_causal": {"vocab": 32, "n_items": 8}},
    "full": {"lm": {"seq_len": 256}, "mlm": {"seq_len": 128}, "translate": {"seq_len": 128},
             "mqar": {"seq_len": 128, "n_pairs": 16},
             "bind": {"n_keys": 64, "n_items": 32, "n_queries": 8},
             "bind_codes": {"n_queries": 8},
             "relation": {"n_context": 64, "n_queries": 32},
             "successor": {"vocab": 64, "n_items": 32},
             "successor_causal": {"vocab": 64, "n_items": 32}},
}

# Training per task and profile (TrainConfig fields), over the profile's steps/lr/batch_size.
# Quick: bind's plateau is broken by large batches (128: 100% in <1000 steps; 32: ~35% after
# 1000); relation (induction) needs lr 1e-3 (at 3e-3 it stays at chance); translate needs 300
# steps before the decoder leaves unigram statistics (chrF ~10 vs 0.3 at 100 steps), and
# evaluates (greedy decoding for chrF) at half time and at the end only.
TASK_TRAIN: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"translate": {"steps": 4}, "mqar": {"lr": 1e-2}, "bind": {"lr": 1e-2},
              "bind_codes": {"lr": 1e-2},
              "relation": {"lr": 1e-2}, "successor": {"lr": 1e-2},
              "successor_causal": {"lr": 1e-2}},
    "quick": {"translate": {"steps": 300, "eval_every": 150},
              "mqar": {"steps": 300, "lr": 1e-2, "batch_size": 32},
              "bind": {"steps": 800, "lr": 3e-3, "batch_size": 128},
              "bind_codes": {"steps": 800, "lr": 3e-3, "batch_size": 128},
              "relation": {"steps": 400, "lr": 1e-3, "batch_size": 32},
              "successor": {"steps": 500, "batch_size": 32},
              "successor_causal": {"steps": 500, "batch_size": 32}},
    # lm and mlm evaluate every quarter: the report shows the val loss at half the budget
    "standard": {"lm": {"lr": 6e-3, "eval_every": 250}, "mlm": {"steps": 1500, "eval_every": 375},
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

PROFILES = {p.name: register_profile(p) for p in (
    QKVProfile("smoke", seeds=(0,), d_model=32, n_layers=1, n_heads=2, batch_size=8, steps=6,
               lr=3e-3, eval_batches=1, task_options=TASK_OPTIONS["smoke"],
               task_train=TASK_TRAIN["smoke"], probe_d_heads=(16, 64), probe_steps=4,
               probe_seeds=(0,), bind_bits=(1,), measure_batch=8, rounds=3,
               decode_tokens=16, n_null=32, cka=False, scale_widths=(16, 32)),
    # quick: the whole study took 1,162 s on the 2-core AMD EPYC (2026-11-23, idle), over its
    # 15-minute target (DEVELOPERS.md), and directed_relation adds ~110 CPU-seconds. So quick
    # leaves mqar out (standard sits at its chance level at this budget, so its comparisons
    # could not count: 218 CPU-s), relation 400 steps (standard: 99.4% at 400, 99.9% at 600,
    # seed 0) and, like mlm, only the equal-width arm (-280). The width price (bind_codes)
    # runs m = 3 on 2 seeds at equal width: 20 runs, about the old bind's 18 (3 seeds).
    # Measured after the trim, fresh clone (2026-11-24): study 573 s, 663 s with the install;
    # on the 2-core AMD EPYC (AVX2, 2026-11-25): study 710 s, 821 s with the install.
    QKVProfile("quick", seeds=(0, 1, 2), d_model=64, n_layers=2, n_heads=4, batch_size=16,
               steps=200, lr=3e-3, eval_batches=8, task_options=TASK_OPTIONS["quick"],
               task_train=TASK_TRAIN["quick"], probe_d_heads=(16, 32, 64, 128, 256),
               probe_steps=60, probe_seeds=(0,), bind_bits=(3,),
               bind_seeds=(0, 1), measure_batch=16, rounds=5, decode_tokens=48,
               n_null=128, cka=True, task_seeds={"mqar": ()},
               task_arms={"relation": ("equal",), "mlm": ("equal",),
                          "bind_codes": ("equal",)},
               tie_cost=CostConfig(), tie_cost_models=("smollm2",)),
    # standard: the questions decided on a 2-core CPU within 2 hours. Sized from single runs
    # on the 2-core AMD EPYC (AVX2; 2026-11-23, two runs side by side, one thread each, as
    # the sweep's two workers run): lm at d_model 64 takes 33 ms a step (1,200 steps: 48 s,
    # val loss 1.64), translate 72 ms (1,000 steps: 83 s, chrF 12.8); bind 20 ms, relation
    # 23 ms, mqar 28 ms (quick's stored runs); d_model 128 ~3.8x d_model 64. The first plan
    # (lm/mlm 1,200 steps, translate 1,000, every comparison 8 seeds and both arms, widths
    # up to 128) summed to ~20,000 CPU-seconds, 2.8 hours on two workers. A first end-to-end
    # run of a smaller plan ran ~1.1x over its estimate and showed mlm on 64-character windows
    # never leaving the unigram plateau, and every lm design choosing the top of its rate grid
    # (9e-3). So: lm 1,000 steps at a grid centred on 6e-3 (val loss still falls there: 1.70
    # at 1,000 steps, 1.50 at 2,000, 1.35 at 4,000 at 3e-3; no affordable budget is flat, so
    # the report shows each design's loss at half and full budget); mlm 1,500 steps on
    # 16-character windows; translate 600; 8 seeds on real text (lm, mlm, translate); mqar and
    # relation 3 seeds and successor 4 (their differences are tens of points), bind 4; mlm's
    # tied designs at equal width only (lm carries the parameter-matched arm); widths 32/64/96
    # on 3 seeds (64 shares the comparisons' runs). Estimate: ~11,800 CPU-seconds, ~1.8 hours
    # with the measures; measured end to end from a fresh clone: 4,414 s (2026-11-24). That
    # run tuned each design on a 3-point grid (1/3, 1, 3 x) at equal width only: every lm
    # design chose the top (1.8e-2) and, trained at it, parameter-matched tied designs (wider
    # heads) stalled on a plateau in 4 of 32 seeds (val loss 2.0-2.3 vs 1.6-1.7). So the grid
    # has a 4th point (9x) and each parameter-matched arm is tuned at its own width. mqar is
    # left out as at quick (standard at chance: 28.4% over 3 seeds, chance 25%), and the width
    # price (bind_codes, m = 2, 3, 4, one head of d_head m - 1 ... 2m, both arms) replaces
    # bind. Its first run on 2 seeds (90 runs, 496 s) found seeds disagreeing at the widths
    # where tied K=V just learns (m = 4, d_head 5: 83% and 98%), so it runs 4 seeds.
    # Pretrained: the whole zoo (~6 min of analysis on the 2-core AMD EPYC with AVX-512,
    # 2026-11-24). Tie costs of the three decoders zero-shot, K=V also one layer at a time:
    # 198 + 236 + 481 s there (`qkvlab tiecost NAME --per-layer kv`), so ~1.9 hours in all.
    # Healing them (8 steps of 2 x 256 tokens at each of 3 rates, rate chosen on validation)
    # took 448 s more for SmolLM2 alone there, ~11 and ~25 min for Gemma and Qwen: past the
    # 2 hours, so healing is full's (and `qkvlab tiecost --heal-steps`).
    QKVProfile("standard", seeds=tuple(range(8)), d_model=64, n_layers=2, n_heads=4,
               batch_size=16, steps=1000, lr=3e-3, eval_batches=16,
               task_options=TASK_OPTIONS["standard"], task_train=TASK_TRAIN["standard"],
               probe_d_heads=(16, 32, 64, 128, 256), probe_steps=60, probe_seeds=(0, 1, 2),
               bind_bits=(2, 3, 4), bind_seeds=(0, 1, 2, 3), measure_batch=16,
               rounds=5, decode_tokens=48, n_null=128, cka=True,
               lr_grid=(1 / 3, 1.0, 3.0, 9.0), lr_seeds=(100,), scale_widths=(32, 64, 96),
               scale_seeds=(0, 1, 2),
               task_seeds={"mqar": (), "relation": (0, 1, 2),
                           "successor": tuple(range(4)), "successor_causal": tuple(range(4))},
               task_arms={"mlm": ("equal",)},
               tie_cost=CostConfig(), tie_cost_per_layer=("kv",),
               tie_cost_models=("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")),
    QKVProfile("full", seeds=(0, 1, 2, 3, 4), d_model=384, n_layers=6, n_heads=6, batch_size=64,
               steps=5000, lr=1e-3, eval_batches=50, task_options=TASK_OPTIONS["full"],
               task_train=TASK_TRAIN["full"], probe_d_heads=(16, 32, 64, 128, 256),
               probe_steps=1000, probe_seeds=(0, 1, 2), bind_bits=(2, 4, 8, 16),
               measure_batch=32, rounds=7, decode_tokens=128, n_null=256, cka=True,
               tie_cost=CostConfig(eval_tokens=8192, calib_tokens=8192, heal_steps=64),
               tie_cost_per_layer=("kv", "qk"),
               tie_cost_models=("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b",
                                "qwen2.5-coder-1.5b")),
)}

@dataclass(frozen=True)
class Margin:
    """A practical margin: differences to standard inside ``±value`` (in ``unit``) do not
    matter for the question, so a 90% CI inside it reads "equivalent" (a TOST at 5%)."""

    value: float
    unit: str
    reason: str


# Written down before the runs (science standards): each metric's margin and why.
MARGINS = {
    "val_loss": Margin(2.0, "% perplexity",
                       "below the +3.1% perplexity that tied K=V costs at 300M–1.2B parameters "
                       "(Kayyam et al. 2026), so an effect of that size reads 'worse', never "
                       "'equivalent'; at a loss of 2 nats it is 1% of the loss"),
    "accuracy": Margin(2.0, "pp",
                       "diagnostic tasks are compared only where standard learns them well above "
                       "chance; a design within 2 points of it has the capacity the task tests"),
    "chrf": Margin(1.0, "chrF",
                   "1 point on chrF's 0–100 scale is about 3% of the chrF ≥ 30 that translation "
                   "is trained to, in line with the loss margin"),
    "bleu": Margin(1.0, "BLEU",
                   "1 BLEU point, the same share of a usable score as chrF's margin; BLEU is "
                   "reported beside chrF (sacrebleu) but chrF is the one the verdicts quote"),
    "symmetry": Margin(0.05, "symmetry score",
                       "a seventh of the encoder–decoder gap published for pretrained models "
                       "(BERT-base 0.51 vs GPT-2 0.15, Saponati et al. 2025): a smaller "
                       "difference would not reproduce that finding"),
    "tokens_per_s": Margin(5.0, "%",
                           "training throughput of one run varies by several per cent between "
                           "runs on a shared CPU"),
}

# The experiments behind the three questions, in the order the study runs them (cheapest
# first, so a smoke study fails fast on a broken set-up).
ORDER = ("scale_probe", "lr_tune", "alt_vs_standard", "alt_init", "lm_tied_kv", "lm_gqa",
         "tied_qk_qkv", "directed_relation", "symmetry_emergence", "bind_vs_dhead", "kv_translate", "lm_scaling")


def arms(task: str, p: QKVProfile, labels: tuple[str, ...], **kw) -> list[Run]:
    """``design_arms`` of some design labels, each at its tuned learning rate (if tuned), on
    the task's seeds and arms of the profile unless ``kw`` names them."""
    if task in p.task_seeds:
        if not p.task_seeds[task]:
            return []
        kw.setdefault("seeds", p.task_seeds[task])
    if task in p.task_arms:
        kw.setdefault("arms", p.task_arms[task])
    arm_list = kw.get("arms", ("equal", "matched"))
    return design_arms(task, p, {d: design_options(d, p) for d in labels},
                       lrs=p.design_lrs(task, labels, arm_list), **kw)


@experiment("lr_tune", "Every design at its own learning rate: the grid the comparisons pick from")
def lr_tune(p: QKVProfile) -> list[Run]:
    runs = []
    for task, labels in TUNED.items():
        base, kind = base_model(p), task_info(task)[1]
        for mult in p.lr_grid:
            lr = lr_of(task, mult, p)
            for seed in p.lr_seeds:
                for arm in ("equal", "matched"):
                    for d in ("standard", *labels):
                        if arm not in p.tuned_arms(task, d):
                            continue
                        m = {**base, **design_options(d, p)}
                        if arm == "matched":
                            m = matched(m, base, kind)
                        runs.append(make_run(task, m, p, seed,
                                             {"design": d, "arm": arm, "lr": lr},
                                             train={"lr": lr}))
    return runs


@experiment("alt_vs_standard", "Q1: does AttentionAlt's extra per-head matrix and outer scale help?")
def alt_vs_standard(p: QKVProfile) -> list[Run]:
    return [r for t in ("lm", "translate") for r in arms(t, p, ("alt",))]


@experiment("scale_probe", "Q1: where must 1/sqrt(d_k) sit? entropy, saturation, grads vs d_k")
def scale_probe(p: QKVProfile) -> list[Run]:
    n = p.probe_steps
    at = sorted({0, max(1, n // 10), n // 4, n // 2, n - 1})
    runs = []
    for seed in p.probe_seeds:
        for d_head in p.probe_d_heads:
            for scale in ("inside", "outside", "both", "none"):
                model = base_model(p, n_heads=2, d_head=d_head, scale=scale)
                runs.append(make_run("lm", model, p, seed,
                                     {"design": scale, "scale": scale, "d_head": d_head,
                                      "init": "unit"},
                                     steps=n, probe=ProbeConfig(steps=tuple(at)),
                                     init=InitConfig(qk="unit"),
                                     train={"eval_every": 0, "checkpoint_every": 0}))
    return runs


TIED_QK = ("tied_qk", "tied_qk_selfmask", "tied_qkv")


@experiment("tied_qk_qkv", "Q2: what does one matrix W = W_Q = W_K (= W_V) cost?")
def tied_qk_qkv(p: QKVProfile) -> list[Run]:
    return [r for t in ("lm", "mlm", "mqar", "relation") for r in arms(t, p, TIED_QK)]


DIRECTED = ("successor", "successor_causal")


@experiment("directed_relation", "Q2: does tied Q=K break a relation between contents, in an "
                                 "encoder and in a decoder?")
def directed_relation(p: QKVProfile) -> list[Run]:
    # The same rule (each token's cyclic successor by id) seen whole by an encoder and causally
    # by a decoder; equal width only (the tie's cost, not its parameters, is the question).
    return [r for t in DIRECTED for r in arms(t, p, TIED_QK[:2], arms=("equal",))]


@experiment("symmetry_emergence", "Q2: do encoders learn a more symmetric W_QK than decoders?")
def symmetry_emergence(p: QKVProfile) -> list[Run]:
    # Same model options and seed -> identical initial weights in both kinds: the build order
    # is the same and lm and mlm share one tokenizer, hence one d_vocab (checked in the tests).
    # mlm may train on shorter windows than lm: both models get lm's context (mlm uses the
    # first positions), so their initial weights stay identical.
    ctx = {t: get_task(t, **p.task_options.get(t, {})).seq_len for t in ("lm", "mlm")}
    model = base_model(p, **({"n_ctx": max(ctx.values())} if len(set(ctx.values())) > 1 else {}))

    def keep(task: str) -> list[int]:  # each kind's checkpoints at 0, 1/4, 1/2 and all its steps
        n = p.task_train.get(task, {}).get("steps", p.steps)
        return sorted({0, n // 4, n // 2, n})
    return [make_run(t, model, p, seed, {"design": "standard", "kind": task_info(t)[1]},
                     train={"keep_at": keep(t)})
            for seed in p.seeds for t in ("mlm", "lm")]


def width_grid(m: int) -> tuple[int, ...]:
    """The d_heads tried for m-bit keys and values: m − 1 (too narrow for standard) to 2m
    (wide enough for tied K=V to hold both codes)."""
    return tuple(range(max(1, m - 1), 2 * m + 1))


# The accuracy at which the width price is read: the d_head a design "needs" is the smallest
# tried whose mean accuracy over seeds reaches it (chance: 1/2^m, at most 25%).
WIDTH_ACCURACY = 0.9


@experiment("bind_vs_dhead", "Q3: what width does K = V cost? The d_head each design needs to "
                             "bind m-bit keys to m-bit values")
def bind_vs_dhead(p: QKVProfile) -> list[Run]:
    # bind_codes fixes each token's input to its key and value codes, so the information a
    # head must match and return has dimension m each (bind_codes' docstring). One layer and
    # one head: the head's width is the axis, and neither a second layer nor another head can
    # route around it. The parameter-matched tied K=V widens that one head by 4/3.
    runs = []
    for m in p.bind_bits:
        opts = {**p.task_options.get("bind_codes", {}), "m": m}
        pm = dataclasses.replace(p, task_options={**p.task_options, "bind_codes": opts})
        for d_head in width_grid(m):
            for spec, tags in design_arms("bind_codes", pm, {"tied_kv": {"design": "tied_kv"}},
                                          arms=p.task_arms.get("bind_codes", ("equal", "matched")),
                                          seeds=p.bind_seeds, d_head=d_head, n_layers=1,
                                          n_heads=1, tie_embeddings=False):
                runs.append((spec, {**tags, "m": m, "d_head": d_head}))
    return runs


@experiment("alt_init", "Q1: is alt's edge on translate its random W_h at init, or training?")
def alt_init(p: QKVProfile) -> list[Run]:
    # alt with W_h = √d_k·I (mix_init="identity"), so that it computes exactly what standard
    # computes at step 0 with the same other weights (those equal the random-W_h alt's of the
    # same seed); alt's and standard's runs are alt_vs_standard's (same specs, same ids).
    return arms("translate", p, ("alt", "alt_identity"), arms=("equal",))


SCALED = ("alt", "tied_qk", "tied_qkv", "tied_kv", "gqa_half")


@experiment("lm_scaling", "Q1–Q3: does each design's gap to standard grow with width?")
def lm_scaling(p: QKVProfile) -> list[Run]:
    # Same depth and d_head at every width (n_heads grows with d_model), equal arm, each
    # design at the learning rate tuned at the profile's own width.
    d_head = p.d_model // p.n_heads
    runs = []
    for width in p.scale_widths:
        pw = dataclasses.replace(p, d_model=width, n_heads=max(1, width // d_head))
        for spec, tags in arms("lm", pw, SCALED, arms=("equal",),
                               seeds=p.scale_seeds or p.seeds):
            runs.append((spec, {**tags, "d_model": width}))
    return runs


@experiment("kv_translate", "Q3: 'for translation K should equal V': tied K=V in cross-attention")
def kv_translate(p: QKVProfile) -> list[Run]:
    return arms("translate", p, ("tied_kv_cross",))


@experiment("lm_tied_kv", "Q3: the LM loss penalty of tied K = V (cf. ~3.1% ppl at 300M-1.2B)")
def lm_tied_kv(p: QKVProfile) -> list[Run]:
    return arms("lm", p, ("tied_kv",))


@experiment("lm_gqa", "Q3: GQA (n_kv_heads = n_heads/2), same KV cache as tied K=V, on lm")
def lm_gqa(p: QKVProfile) -> list[Run]:
    # Its KV cache per token equals tied K=V's (one buffer of H heads vs two of H/2); the
    # baseline runs are lm_tied_kv's (same spec, same id), so this costs one run per seed.
    return arms("lm", p, ("gqa_half",), arms=("equal",))


