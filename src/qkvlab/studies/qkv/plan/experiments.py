"""The experiments behind the three questions, registered on import: each maps claims from
the threads (``claims.py``) to runs, built from the profiles (``profiles.py``), the design
vocabulary (``vocab.py``) and, where a profile tunes them, the learning rates ``rates.py``
chooses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from qkvlab.data import get_task
from qkvlab.experiments.registry import (
    Run,
    base_model,
    design_arms,
    experiment,
    make_run,
    register_preparer,
    task_info,
)
from qkvlab.studies.qkv.plan.profiles import QKVProfile
from qkvlab.studies.qkv.plan.rates import (
    chosen_lrs,
    design_lrs,
    lr_edge_runs,
    lr_edge_plan,
    placement_edge_plan,
    tuning_runs,
)
from qkvlab.studies.qkv.plan.scale import (  # noqa: F401 (registers)
    scale_train,
    scale_tune,
    scale_tune_edge,
)
from qkvlab.studies.qkv.plan import headwidth, uptrain
from qkvlab.studies.qkv.plan.scaling import EXPERIMENTS as SCALING  # registers them
from qkvlab.studies.qkv.plan.scaling import tuned_status
from qkvlab.studies.qkv.plan.questions import designs_on
from qkvlab.studies.qkv.plan.vocab import CONTROL, DESIGNS, SCALED
from qkvlab.train import InitConfig, ProbeConfig

# What an experiment's runs are for. compute.results compares only a "comparison"'s runs
# (design vs standard per task); "scaling"'s are compared per cell by compute.scaling.
ROLES = {"probe": "measured at init and early in training, not compared",
         "tuning": "chooses rates on val; never scored on test",
         "comparison": "each design against standard, paired by seed",
         "measure": "trained for the measures made on its checkpoints",
         "scaling": "compared per size and budget cell (compute.scaling)",
         "conversion": "each start against the untied model and K=V from scratch, paired by "
                       "seed (compute.uptrain)",
         "head_width": "each design against standard per (d_model, n_heads) cell, paired by "
                       "seed (compute.headwidth)"}


@dataclass(frozen=True)
class StudyExperiment:
    """One experiment of the study: its name (``@experiment``'s), its ``ROLES`` key, and the
    metrics its comparisons read besides each task's own."""

    name: str
    role: str
    metrics: tuple[str, ...] = ()


SPEED, TEXT = ("tokens_per_s",), ("chrf", "bleu")
# The experiments behind the three questions, in the order the study runs them (cheapest
# first, so a smoke study fails fast on a broken set-up).
STUDY = (StudyExperiment("scale_probe", "probe"), StudyExperiment("lr_tune", "tuning"),
         StudyExperiment("lr_tune_edge", "tuning"),
         StudyExperiment("scale_tune", "tuning"), StudyExperiment("scale_tune_edge", "tuning"),
         StudyExperiment("alt_vs_standard", "comparison", SPEED + TEXT),
         StudyExperiment("alt_init", "comparison"), StudyExperiment("scale_train", "comparison"),
         StudyExperiment("lm_tied_kv", "comparison", SPEED),
         StudyExperiment("lm_gqa", "comparison", SPEED),
         StudyExperiment("tied_qk_qkv", "comparison", SPEED),
         StudyExperiment("directed_relation", "comparison"),
         StudyExperiment("symmetry_emergence", "measure"),
         StudyExperiment("bind_vs_dhead", "comparison"),
         StudyExperiment("kv_translate", "comparison", TEXT),
         StudyExperiment("lm_scaling", "comparison"),
         StudyExperiment("uptrain_tune", "tuning"), StudyExperiment("uptrain_tune_edge", "tuning"),
         StudyExperiment("lm_convert", "conversion"),
         StudyExperiment("head_width_tune", "tuning"),
         StudyExperiment("head_width_tune_edge", "tuning"),
         StudyExperiment("head_width", "head_width"),
         *(StudyExperiment(name, "scaling") for name in SCALING))
ORDER = tuple(e.name for e in STUDY)
BY_NAME = {e.name: e for e in STUDY}


def read_rates(p: QKVProfile, store) -> QKVProfile:
    """``p`` with its ``Rates`` read from ``store`` (``Profile.prepared`` calls it): the scaling
    tuning runs' statuses where the profile tunes scaling, the rates ``lr_tune`` and
    ``scale_tune`` chose where it tunes rates; what is already read stays."""
    r = p.rates
    if p.scaling_lr_grid and r.scaling_tuned is None:
        r = dataclasses.replace(r, scaling_tuned=tuned_status(store, p.name))
    if p.lr_grid and r.lrs is None:
        r = dataclasses.replace(r, lrs=chosen_lrs(p, store),
                                scale_edge_points=placement_edge_plan(p, store),
                                lr_edge_points=lr_edge_plan(p, store))
    p = p if r is p.rates else dataclasses.replace(p, rates=r)
    return uptrain.with_stored(p, store)


register_preparer(QKVProfile, read_rates)


def arms(task: str, p: QKVProfile, labels: tuple[str, ...], **kw) -> list[Run]:
    """``design_arms`` of some design labels, each at its tuned learning rate (if tuned), on
    the task's seeds and arms of the profile unless ``kw`` names them; and the attention-free
    control on the same seeds at equal width (``control_runs``)."""
    if task in p.task_seeds:
        if not p.task_seeds[task]:
            return []
        kw.setdefault("seeds", p.task_seeds[task])
    if task in p.task_arms:
        kw.setdefault("arms", p.task_arms[task])
    arm_list = kw.get("arms", ("equal", "matched"))
    runs = design_arms(task, p, {d: DESIGNS[d].model_options(p) for d in labels},
                       lrs=design_lrs(p, task, labels, arm_list), **kw)
    return runs + control_runs(task, p, **kw) if "equal" in arm_list else runs


def control_runs(task: str, p: QKVProfile, **kw) -> list[Run]:
    """The control (``vocab.CONTROL``: uniform scores, no Q or K) at equal width on ``kw``'s
    seeds, at its own tuned rate: only new runs, so every other run keeps its id. The same spec
    in several experiments is one run, trained once (lm's control serves five experiments)."""
    kw = {**kw, "arms": ("equal",)}
    runs = design_arms(task, p, {CONTROL: DESIGNS[CONTROL].model_options(p)},
                       lrs=design_lrs(p, task, (CONTROL,), ("equal",)), **kw)
    return [(spec, tags) for spec, tags in runs if tags["design"] == CONTROL]


def compared_runs(experiment: str, p: QKVProfile) -> list[Run]:
    """An experiment's runs from its questions' rows (``questions.designs_on``): on each task
    the designs compared there with standard and the control (``arms``), in the rows' arms
    where they name only the equal one, else in the profile's."""
    return [r for task, (designs, only) in designs_on(experiment).items()
            for r in arms(task, p, designs, **({"arms": only} if only else {}))]


@experiment("lr_tune", "Every design at its own learning rate: the grid the comparisons pick from")
def lr_tune(p: QKVProfile) -> list[Run]:
    return tuning_runs(p)


@experiment("lr_tune_edge", "lr_tune's grid followed outward (up to 3 steps) where a design's "
                            "choice sits on its edge")
def lr_tune_edge(p: QKVProfile) -> list[Run]:
    return lr_edge_runs(p)


@experiment("alt_vs_standard", "Q1: does AttentionAlt's extra per-head matrix and outer scale "
                               "help?")
def alt_vs_standard(p: QKVProfile) -> list[Run]:
    return compared_runs("alt_vs_standard", p)


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



@experiment("tied_qk_qkv", "Q2: what does one matrix W = W_Q = W_K (= W_V) cost?")
def tied_qk_qkv(p: QKVProfile) -> list[Run]:
    return compared_runs("tied_qk_qkv", p)


@experiment("directed_relation", "Q2: does tied Q=K break a relation between contents, in an "
                                 "encoder and in a decoder?")
def directed_relation(p: QKVProfile) -> list[Run]:
    # The same rule (each token's cyclic successor by id) seen whole by an encoder and causally
    # by a decoder; equal width only (the tie's cost, not its parameters, is the question).
    return compared_runs("directed_relation", p)


@experiment("symmetry_emergence", "Q2: do encoders learn a more symmetric W_QK than decoders?")
def symmetry_emergence(p: QKVProfile) -> list[Run]:
    # Same model options and seed -> identical initial weights in both kinds: the build order
    # is the same and lm_char and mlm share one tokenizer (characters), hence one d_vocab
    # (checked in the tests); the headline lm's BPE would give the decoder another vocabulary.
    # mlm may train on shorter windows than lm_char: both models get the longer context (mlm
    # uses the first positions), so their initial weights stay identical.
    ctx = {t: get_task(t, **p.task_options.get(t, {})).seq_len for t in ("lm_char", "mlm")}
    model = base_model(p, **({"n_ctx": max(ctx.values())} if len(set(ctx.values())) > 1 else {}))

    def keep(task: str) -> list[int]:  # each kind's checkpoints at 0, 1/4, 1/2 and all its steps
        n = p.task_train.get(task, {}).get("steps", p.steps)
        return sorted({0, n // 4, n // 2, n})
    return [make_run(t, model, p, seed, {"design": "standard", "kind": task_info(t)[1]},
                     train={"keep_at": keep(t)})
            for seed in p.seeds for t in ("mlm", "lm_char")]


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
            over = dict(seeds=p.bind_seeds, d_head=d_head, n_layers=1, n_heads=1,
                        tie_embeddings=False)
            found = design_arms("bind_codes", pm, {"tied_kv": {"design": "tied_kv"}},
                                arms=p.task_arms.get("bind_codes", ("equal", "matched")), **over)
            if d_head == m:  # the control where the verdict is read (m = d_head, Q3's family)
                found += control_runs("bind_codes", pm, **over)
            for spec, tags in found:
                runs.append((spec, {**tags, "m": m, "d_head": d_head}))
    return runs


@experiment("alt_init", "Q1: is alt's edge on translate its random W_h at init, or training?")
def alt_init(p: QKVProfile) -> list[Run]:
    # alt with W_h = √d_k·I (mix_init="identity"), so that it computes exactly what standard
    # computes at step 0 with the same other weights (those equal the random-W_h alt's of the
    # same seed); alt's and standard's runs are alt_vs_standard's (same specs, same ids).
    return arms("translate", p, ("alt", "alt_identity"), arms=("equal",))



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
    return compared_runs("kv_translate", p)


@experiment("lm_tied_kv", "Q3: the LM loss penalty of tied K = V (cf. ~3.1% ppl per token at "
                          "300M-1.2B)")
def lm_tied_kv(p: QKVProfile) -> list[Run]:
    return compared_runs("lm_tied_kv", p)


@experiment("lm_gqa", "Q3: GQA (n_kv_heads = n_heads/2), same KV cache as tied K=V, on lm")
def lm_gqa(p: QKVProfile) -> list[Run]:
    # Its KV cache per token equals tied K=V's (one buffer of H heads vs two of H/2); the
    # baseline runs are lm_tied_kv's (same spec, same id), so this costs one run per seed.
    return compared_runs("lm_gqa", p)


@experiment("uptrain_tune", "Q3: the uptraining rate of each start of the controlled conversion, "
                            "chosen on val")
def uptrain_tune(p: QKVProfile) -> list[Run]:
    return uptrain.tuning_runs(p)


@experiment("uptrain_tune_edge", "Q3: the uptraining rate grid followed outward (up to 3 "
                                 "steps) where a start's choice sits on its edge")
def uptrain_tune_edge(p: QKVProfile) -> list[Run]:
    return uptrain.edge_runs(p)


@experiment("lm_convert", "Q3: the study's own lm converted to K = V from each start and "
                          "uptrained: as good as training with the tie?")
def lm_convert(p: QKVProfile) -> list[Run]:
    return uptrain.reported_runs(p)


@experiment("head_width_tune", "Q3: each design's rate in each head-width cell, chosen on val")
def head_width_tune(p: QKVProfile) -> list[Run]:
    return headwidth.tuning_runs(p)


@experiment("head_width_tune_edge", "Q3: the head-width cells' rate grid followed outward (up "
                                    "to 3 steps) where a choice sits on its edge")
def head_width_tune_edge(p: QKVProfile) -> list[Run]:
    return headwidth.edge_runs(p)


@experiment("head_width", "Q3: does K = V's cost fall as d_head grows, at fixed width and "
                          "depth (n_heads × d_head = d_model)?")
def head_width(p: QKVProfile) -> list[Run]:
    return headwidth.reported_runs(p)
