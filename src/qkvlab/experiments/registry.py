"""Named experiments: Python functions returning run configs, registered by name (zoology style).

An experiment maps a claim from the threads in ``seeds/`` to runs. Each run is a pair
``(spec, tags)``: the spec is everything that determines the result (hashed into the run id;
see ``qkvlab.train.run_from_spec``), the tags say what the run stands for in this experiment
(design, arm, task, seed, ...). Comparisons come in two arms: ``equal`` (same d_model, n_heads,
d_head) and ``matched`` (the tied design widened by d_head until its non-embedding parameter
count equals ``standard``'s, ``qkvlab.models.match_params``), so "needs more parameters" can
be read off directly. The baseline appears in both arms under the same run id.

Profiles: ``smoke`` (every experiment end to end in CI), ``quick`` (the report's numbers on a
2-core CPU in minutes, 3 seeds), ``full`` (GPU scale).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any, Callable

from qkvlab.experiments.store import canonical
from qkvlab.models import ModelConfig, config_params, match_params
from qkvlab.train import TrainConfig

Run = tuple[dict[str, Any], dict[str, Any]]  # (spec, tags)


@dataclass(frozen=True)
class Profile:
    """Sizes of one profile. ``steps``/``lr``/``batch_size`` are the defaults of every task;
    ``TASK_TRAIN`` overrides them per task (translation and the synthetic tasks need other
    step counts, learning rates and batches to be learned at all at small sizes)."""

    name: str
    seeds: tuple[int, ...]
    d_model: int
    n_layers: int
    n_heads: int
    batch_size: int
    steps: int
    lr: float
    eval_batches: int
    probe_d_heads: tuple[int, ...]
    probe_steps: int
    probe_seeds: tuple[int, ...]
    bind_d_heads: tuple[int, ...]
    bind_seeds: tuple[int, ...] = ()  # empty: ``seeds``


PROFILES: dict[str, Profile] = {
    "smoke": Profile("smoke", seeds=(0,), d_model=32, n_layers=1, n_heads=2, batch_size=8,
                     steps=6, lr=3e-3, eval_batches=1, probe_d_heads=(16, 64), probe_steps=4,
                     probe_seeds=(0,), bind_d_heads=(4,)),
    # quick: the whole study in about 12 minutes on the 2-core CPU (see the README)
    "quick": Profile("quick", seeds=(0, 1, 2), d_model=64, n_layers=2, n_heads=4, batch_size=16,
                     steps=200, lr=3e-3, eval_batches=8, probe_d_heads=(16, 32, 64, 128, 256),
                     probe_steps=60, probe_seeds=(0,), bind_d_heads=(1, 2, 4),
                     bind_seeds=(0, 1, 2, 3, 4)),
    "full": Profile("full", seeds=(0, 1, 2, 3, 4), d_model=384, n_layers=6, n_heads=6,
                    batch_size=64, steps=5000, lr=1e-3, eval_batches=50,
                    probe_d_heads=(16, 32, 64, 128, 256), probe_steps=1000, probe_seeds=(0, 1, 2),
                    bind_d_heads=(2, 4, 8, 16, 32, 64)),
}

EXPERIMENTS: dict[str, Callable[[Profile], list[Run]]] = {}
QUESTIONS: dict[str, str] = {}


def experiment(name: str, question: str = ""):
    """Decorator: register ``fn(profile) -> list[(spec, tags)]`` under ``name``."""
    def deco(fn):
        if name in EXPERIMENTS:
            raise ValueError(f"experiment: {name!r} registered twice")
        EXPERIMENTS[name] = fn
        QUESTIONS[name] = question
        return fn
    return deco


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"profile: {name!r} is not one of {list(PROFILES)}")
    return PROFILES[name]


def runs_of(name: str, profile: Profile | str) -> list[Run]:
    """The (spec, tags) list of a registered experiment at a profile."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown {name!r}; allowed: {sorted(EXPERIMENTS)}")
    p = get_profile(profile) if isinstance(profile, str) else profile
    return EXPERIMENTS[name](p)


# ---- building blocks ---------------------------------------------------------------------
def _task_info(task: str) -> tuple[int, str]:
    """(version, model kind) of a registered task, without preparing its data."""
    from qkvlab.data import TASKS

    if task not in TASKS:
        raise ValueError(f"task: unknown {task!r}; allowed: {sorted(TASKS)}")
    return TASKS[task].version, TASKS[task].model_kind


# Task options per profile: short contexts and small vocabularies keep CPU runs in seconds.
# At quick sizes bind and relation are learned to ~100% by standard attention (measured over
# seeds; bigger key sets or a context that is the whole vocabulary stay at chance for
# thousands of steps), so a tied design's shortfall is a cost of the tie, not of the budget.
TASK_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"lm": {"seq_len": 32}, "mlm": {"seq_len": 32},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 8, "decode_batch": 8},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 16, "n_values": 8, "group_size": 4, "n_items": 8, "n_queries": 2},
              "relation": {"vocab": 16, "n_context": 16, "n_queries": 8}},
    "quick": {"lm": {"seq_len": 64}, "mlm": {"seq_len": 64},
              "translate": {"seq_len": 48, "vocab_size": 1000, "n_decode": 32, "decode_batch": 32},
              "mqar": {"seq_len": 32, "vocab": 64, "n_pairs": 4},
              "bind": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8, "n_queries": 4},
              "relation": {"vocab": 32, "n_context": 12, "n_queries": 11}},
    "full": {"lm": {"seq_len": 256}, "mlm": {"seq_len": 128}, "translate": {"seq_len": 128},
             "mqar": {"seq_len": 128, "n_pairs": 16},
             "bind": {"n_keys": 64, "n_items": 32, "n_queries": 8},
             "relation": {"n_context": 64, "n_queries": 32}},
}

# Training per task and profile (TrainConfig fields), over the profile's steps/lr/batch_size.
# Quick: bind's plateau is broken by large batches (128: 100% in <1000 steps; 32: ~35% after
# 1000); relation (induction) needs lr 1e-3 (at 3e-3 it stays at chance); translate needs 300
# steps before the decoder leaves unigram statistics (chrF ~10 vs 0.3 at 100 steps), and
# evaluates (greedy decoding for chrF) at half time and at the end only.
TASK_TRAIN: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"translate": {"steps": 4}, "mqar": {"lr": 1e-2}, "bind": {"lr": 1e-2},
              "relation": {"lr": 1e-2}},
    "quick": {"translate": {"steps": 300, "eval_every": 150},
              "mqar": {"steps": 300, "lr": 1e-2, "batch_size": 32},
              "bind": {"steps": 800, "lr": 3e-3, "batch_size": 128},
              "relation": {"steps": 600, "lr": 1e-3, "batch_size": 32}},
    "full": {"mqar": {"steps": 3000}, "bind": {"steps": 3000}, "relation": {"steps": 3000}},
}


def task_options(task: str, p: Profile) -> dict[str, Any]:
    return dict(TASK_OPTIONS.get(p.name, TASK_OPTIONS["quick"]).get(task, {}))


def base_model(p: Profile, **over) -> dict[str, Any]:
    """Model options of a profile (d_vocab and n_ctx come from the task at run time)."""
    return {"d_model": p.d_model, "n_layers": p.n_layers, "n_heads": p.n_heads, **over}


def matched(model: dict[str, Any], baseline: dict[str, Any], kind: str) -> dict[str, Any]:
    """``model`` widened by d_head to the non-embedding parameter count of ``baseline``.

    Non-embedding counts do not depend on the vocabulary or context, so placeholders suffice.
    """
    return json.loads(_matched(canonical(model), canonical(baseline), kind))


@functools.lru_cache(maxsize=None)
def _matched(model_json: str, baseline_json: str, kind: str) -> str:
    ph = {"d_vocab": 64, "n_ctx": 64}
    model, baseline = json.loads(model_json), json.loads(baseline_json)
    cfg, goal = ModelConfig(**ph, **model), ModelConfig(**ph, **baseline)
    want = config_params(goal, kind)["non_embedding"]

    def count(d_head: int) -> int:
        return config_params(cfg.replace(d_head=d_head, d_v=None), kind)["non_embedding"]

    # With d_v following d_head, every parameter count is a polynomial of degree <= 2 in d_head
    # (projections linear, alt's per-head d_v x d_v matrix quadratic): three counts fit it
    # exactly, so we solve instead of building a model per candidate width (slow even on meta).
    c1, c2, c3 = count(1), count(2), count(3)
    a = (c3 - 2 * c2 + c1) / 2
    b = c2 - c1 - 3 * a
    c = c1 - a - b
    if a:
        w = (-b + (b * b - 4 * a * (c - want)) ** 0.5) / (2 * a)
    else:
        w = (want - c) / b
    cands = [x for x in {int(w), int(w) + 1} if x >= 1]
    best = min(cands, key=lambda x: abs(a * x * x + b * x + c - want))
    if abs(count(best) - want) <= 0.01 * want:
        out = cfg.replace(d_head=best, d_v=None)
    else:  # too coarse a step: let match_params close the gap with d_mlp
        out = match_params(cfg, goal, kind=kind, by="d_head", key="non_embedding")
    d = {k: v for k, v in out.to_dict().items() if k not in ph}
    default = ModelConfig(**ph).to_dict()  # keep only what differs, so equal configs hash equally
    return canonical({k: v for k, v in d.items() if v != default[k] or k in model})


def make_run(task: str, model: dict[str, Any], p: Profile, seed: int, tags: dict[str, Any], *,
             steps: int | None = None, train: dict[str, Any] | None = None,
             probe: dict[str, Any] | None = None, init: dict[str, Any] | None = None) -> Run:
    version, kind = _task_info(task)
    per_task = dict(TASK_TRAIN.get(p.name, {}).get(task, {}))
    n = steps or per_task.pop("steps", p.steps)
    per_task.pop("steps", None)
    opts = dict(steps=n, batch_size=p.batch_size, lr=p.lr, warmup=max(1, n // 10),
                eval_batches=p.eval_batches, eval_every=n // 5 if n >= 50 else 0,
                log_every=max(1, n // 25), checkpoint_every=max(2, n // 4), seed=seed)
    opts.update(per_task)
    tc = TrainConfig(**{**opts, **(train or {})})
    spec: dict[str, Any] = {"task": task, "task_version": version,
                            "task_options": task_options(task, p), "kind": kind,
                            "model": model, "train": tc.to_dict()}
    if probe:
        spec["probe"] = probe
    if init:
        spec["init"] = init
    return spec, {"task": task, "seed": seed, **tags}


def design_arms(task: str, p: Profile, designs: dict[str, dict[str, Any]],
                arms: tuple[str, ...] = ("equal", "matched"), seeds: tuple[int, ...] = (),
                **model_over) -> list[Run]:
    """``standard`` and each design, per arm and seed (``seeds`` or the profile's).
    ``designs`` maps a label to model options."""
    _, kind = _task_info(task)
    base = base_model(p, **model_over)
    runs: list[Run] = []
    for seed in seeds or p.seeds:
        for arm in arms:
            runs.append(make_run(task, base, p, seed, {"design": "standard", "arm": arm}))
            for label, opts in designs.items():
                m = {**base, **opts}
                if arm == "matched":
                    m = matched(m, base, kind)
                runs.append(make_run(task, m, p, seed, {"design": label, "arm": arm}))
    return runs


# ---- the experiments -----------------------------------------------------------------------
@experiment("alt_vs_standard", "Q1: does AttentionAlt's extra per-head matrix and outer scale help?")
def alt_vs_standard(p: Profile) -> list[Run]:
    return [r for t in ("lm", "translate") for r in design_arms(t, p, {"alt": {"design": "alt"}})]


@experiment("scale_probe", "Q1: where must 1/sqrt(d_k) sit? entropy, saturation, grads vs d_k")
def scale_probe(p: Profile) -> list[Run]:
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
                                     steps=n, probe={"steps": at}, init={"qk": "unit"},
                                     train={"eval_every": 0, "checkpoint_every": 0}))
    return runs


TIED_QK = {"tied_qk": {"design": "tied_qk"},
           "tied_qk_selfmask": {"design": "tied_qk", "self_mask": True},
           "tied_qkv": {"design": "tied_qkv"}}


@experiment("tied_qk_qkv", "Q2: what does one matrix W = W_Q = W_K (= W_V) cost?")
def tied_qk_qkv(p: Profile) -> list[Run]:
    return [r for t in ("lm", "mlm", "mqar", "relation") for r in design_arms(t, p, TIED_QK)]


@experiment("symmetry_emergence", "Q2: do encoders learn a more symmetric W_QK than decoders?")
def symmetry_emergence(p: Profile) -> list[Run]:
    # Same model options and seed -> identical initial weights in both kinds: the build order
    # is the same and lm and mlm share one tokenizer, hence one d_vocab (checked in the tests).
    n = p.steps
    keep = sorted({0, n // 4, n // 2, n})
    model = base_model(p)
    return [make_run(t, model, p, seed, {"design": "standard", "kind": _task_info(t)[1]},
                     train={"keep_at": keep})
            for seed in p.seeds for t in ("mlm", "lm")]


@experiment("bind_vs_dhead", "Q3: does K = V lose the capacity binding needs, and where does "
                             "the gap close as d_head grows?")
def bind_vs_dhead(p: Profile) -> list[Run]:
    runs = []
    for d_head in p.bind_d_heads:
        # Equal width only: the d_head sweep is itself the capacity axis. One layer: a query
        # matching a key and reading its value is one head's job, and a second layer could
        # route around a tied head's limits (it would also learn more slowly).
        for spec, tags in design_arms("bind", p, {"tied_kv": {"design": "tied_kv"}},
                                      arms=("equal",), seeds=p.bind_seeds, d_head=d_head,
                                      n_layers=1):
            runs.append((spec, {**tags, "d_head": d_head}))
    return runs


@experiment("kv_translate", "Q3: 'for translation K should equal V': tied K=V in cross-attention")
def kv_translate(p: Profile) -> list[Run]:
    return design_arms("translate", p, {"tied_kv_cross": {"roles": {"cross": {"design": "tied_kv"}}}})


@experiment("lm_tied_kv", "Q3: the LM loss penalty of tied K = V (cf. ~3.1% ppl at 300M-1.2B)")
def lm_tied_kv(p: Profile) -> list[Run]:
    return design_arms("lm", p, {"tied_kv": {"design": "tied_kv"}})


@experiment("lm_gqa", "Q3: GQA (n_kv_heads = n_heads/2), same KV cache as tied K=V, on lm")
def lm_gqa(p: Profile) -> list[Run]:
    # Its KV cache per token equals tied K=V's (one buffer of H heads vs two of H/2); the
    # baseline runs are lm_tied_kv's (same spec, same id), so this costs one run per seed.
    return design_arms("lm", p, {"gqa_half": {"n_kv_heads": max(1, p.n_heads // 2)}},
                       arms=("equal",))


def describe(profile: str = "quick") -> list[dict[str, Any]]:
    """Name, question and number of runs (and distinct run ids) per experiment."""
    from qkvlab.experiments.store import run_id

    p = get_profile(profile)
    out = []
    for name in sorted(EXPERIMENTS):
        runs = runs_of(name, p)
        out.append({"experiment": name, "question": QUESTIONS[name], "runs": len(runs),
                    "distinct": len({run_id(s) for s, _ in runs})})
    return out


def replace_profile(p: Profile, **changes) -> Profile:
    """A copy of a profile with some sizes changed (ValueError naming an unknown field)."""
    known = {f.name for f in dataclasses.fields(p)}
    bad = sorted(set(changes) - known)
    if bad:
        raise ValueError(f"profile.{bad[0]}: not a profile field; allowed: {sorted(known)}")
    return dataclasses.replace(p, **changes)
