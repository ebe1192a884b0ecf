"""Named experiments and profiles: Python functions returning run specs, registered by name
(zoology style), and the machinery the studies build them with.

An experiment maps a claim to runs. Each run is a pair ``(spec, tags)``: the ``RunSpec`` is
everything that determines the result (hashed into the run id), the tags say what the run
stands for in this experiment (design, arm, task, seed, ...). Comparisons come in two arms:
``equal`` (same d_model, n_heads, d_head) and ``matched`` (the design widened by d_head until
its non-embedding parameter count equals the baseline's, ``qkvlab.models.match_params``).

The experiments and profiles themselves live in studies (``qkvlab.studies.qkv`` is the three
questions' study). A study is a module that registers them when imported; installed studies are
found through the ``qkvlab.studies`` entry-point group (see pyproject.toml), so this library
never imports a study by name. ``load_studies()`` runs once, on first use of the registry.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from qkvlab.data import TASKS
from qkvlab.experiments.store import canonical, run_id
from qkvlab.models import ModelConfig, config_params, match_params
from qkvlab.train import InitConfig, ProbeConfig, RunSpec, TrainConfig

Run = tuple[RunSpec, dict[str, Any]]  # (spec, tags)
STUDY_GROUP = "qkvlab.studies"


@dataclass(frozen=True)
class Profile:
    """Sizes of one profile. ``steps``/``lr``/``batch_size`` are every task's defaults;
    ``task_options[task]`` are the task's options and ``task_train[task]`` its ``TrainConfig``
    overrides (synthetic tasks need other step counts, rates and batches to be learned at all).
    ``test_batches``: batches of the held-out test split that score every run once at its end
    (``TrainConfig.test_batches``; None: as many as ``eval_batches``; 0: none). Studies
    subclass it to add sizes of their own."""

    name: str
    seeds: tuple[int, ...]
    d_model: int
    n_layers: int
    n_heads: int
    batch_size: int
    steps: int
    lr: float
    eval_batches: int
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    task_train: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    test_batches: int | None = None
    # the experiments this profile runs (empty: every experiment); any other lists no runs
    experiments: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.test_batches is None:
            object.__setattr__(self, "test_batches", self.eval_batches)

    def prepared(self, store: Any) -> "Profile":
        """This profile completed from stored results (e.g. learning rates a tuning experiment
        chose), for experiments whose runs depend on earlier ones: what the preparer a study
        registered for its profile class returns (``register_preparer``); by default itself."""
        prepare = PREPARERS.get(type(self))
        return self if prepare is None else prepare(self, store)


# A study's profile class -> the function that completes one of its profiles from a store. The
# study's plan registers it where it reads the store, so its profiles (sizes) import nothing of
# how results are read back.
PREPARERS: dict[type, Callable[[Profile, Any], Profile]] = {}


def register_preparer(cls: type, prepare: Callable[[Any, Any], Any]) -> None:
    """``Profile.prepared`` of a ``cls`` profile calls ``prepare(profile, store)``."""
    PREPARERS[cls] = prepare


EXPERIMENTS: dict[str, Callable[[Profile], list[Run]]] = {}
QUESTIONS: dict[str, str] = {}
PROFILES: dict[str, Profile] = {}
STUDIES: dict[str, ModuleType] = {}


@functools.lru_cache(maxsize=1)
def load_studies() -> dict[str, ModuleType]:
    """Import every installed study once (entry points of group ``qkvlab.studies``)."""
    for ep in entry_points(group=STUDY_GROUP):
        if ep.name not in STUDIES:
            STUDIES[ep.name] = importlib.import_module(ep.value)
    return STUDIES


def experiment(name: str, question: str = ""):
    """Decorator: register ``fn(profile) -> list[(spec, tags)]`` under ``name``; at a profile
    whose ``experiments`` leave ``name`` out, the registered function lists no runs."""
    def deco(fn):
        if name in EXPERIMENTS:
            raise ValueError(f"experiment: {name!r} registered twice")

        @functools.wraps(fn)
        def runs(p: Profile):
            if p.experiments and name not in p.experiments:
                return []
            return fn(p)
        EXPERIMENTS[name] = runs
        QUESTIONS[name] = question
        return fn
    return deco


class ResultsPending(ValueError):
    """An experiment's runs depend on results of another that the store does not hold yet
    (e.g. learning rates a tuning experiment chooses). ``sweep`` runs the other first when
    both are asked for; the message names what to run."""


def register_profile(p: Profile) -> Profile:
    if p.name in PROFILES:
        raise ValueError(f"profile: {p.name!r} registered twice")
    PROFILES[p.name] = p
    return p


def profile_names() -> list[str]:
    load_studies()
    return list(PROFILES)


def experiment_names() -> list[str]:
    load_studies()
    return sorted(EXPERIMENTS)


def get_profile(name: str | Profile) -> Profile:
    """The registered profile ``name``; ValueError naming the allowed ones."""
    if isinstance(name, Profile):
        return name
    load_studies()
    if name not in PROFILES:
        raise ValueError(f"profile: {name!r} is not one of {list(PROFILES)}")
    return PROFILES[name]


def check_experiment(name: str) -> None:
    """ValueError naming the registered experiments unless ``name`` is one (or ``all``)."""
    load_studies()
    if name != "all" and name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown {name!r}; allowed: {sorted(EXPERIMENTS)} or 'all'")


def runs_of(name: str, profile: Profile | str, store: Any = None) -> list[Run]:
    """The (spec, tags) list of a registered experiment at a profile, completed from the
    results ``store`` where its runs depend on earlier ones (``Profile.prepared``).

    Raises:
        ResultsPending: the experiment needs results the store does not have yet (the message
            names the experiment to run first).
        ValueError: unknown experiment or profile.
    """
    check_experiment(name)
    p = get_profile(profile)
    return EXPERIMENTS[name](p if store is None else p.prepared(store))


def member_keys(runs: list[Run]) -> set[tuple[str, str]]:
    """``(run id, canonical tags)`` of each listed run: the memberships an experiment's
    current definition makes (a store keeps those of earlier definitions too)."""
    return {(run_id(s.to_dict() if hasattr(s, "to_dict") else dict(s)), canonical(dict(t)))
            for s, t in runs}


def describe(profile: str = "quick") -> list[dict[str, Any]]:
    """Name, question and number of runs (and distinct run ids) per experiment."""
    p = get_profile(profile)
    out = []
    for name in experiment_names():
        try:
            runs = runs_of(name, p)
        except ValueError:  # its runs depend on stored results of another experiment
            out.append({"experiment": name, "question": QUESTIONS[name], "runs": None,
                        "distinct": None})
            continue
        out.append({"experiment": name, "question": QUESTIONS[name], "runs": len(runs),
                    "distinct": len({run_id(s.to_dict()) for s, _ in runs})})
    return out


# ---- building blocks ---------------------------------------------------------------------
def task_info(task: str) -> tuple[int, str]:
    """(version, model kind) of a registered task, without preparing its data."""
    if task not in TASKS:
        raise ValueError(f"task: unknown {task!r}; allowed: {sorted(TASKS)}")
    return TASKS[task].version, TASKS[task].model_kind


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
             probe: ProbeConfig | None = None, init: InitConfig | None = None) -> Run:
    """One run of ``task`` with ``model`` options at profile ``p``: the profile's training
    defaults, then the task's overrides (``p.task_train``), then ``steps``/``train``."""
    version, kind = task_info(task)
    per_task = dict(p.task_train.get(task, {}))
    n = steps or per_task.pop("steps", p.steps)
    per_task.pop("steps", None)
    opts = dict(steps=n, batch_size=p.batch_size, lr=p.lr, warmup=max(1, n // 10),
                eval_batches=p.eval_batches, test_batches=p.test_batches,
                eval_every=n // 5 if n >= 50 else 0,
                log_every=max(1, n // 25), checkpoint_every=max(2, n // 4), seed=seed)
    opts.update(per_task)
    tc = TrainConfig.from_dict({**opts, **(train or {})})
    spec = RunSpec(task=task, task_version=version, task_options=p.task_options.get(task, {}),
                   kind=kind, model=model, train=tc, probe=probe, init=init)
    return spec, {"task": task, "seed": seed, **tags}


def design_arms(task: str, p: Profile, designs: dict[str, dict[str, Any]],
                arms: tuple[str, ...] = ("equal", "matched"), seeds: tuple[int, ...] = (),
                lrs: Mapping[tuple[str, str], float] | None = None, **model_over) -> list[Run]:
    """``standard`` and each design, per arm and seed (``seeds`` or the profile's).
    ``designs`` maps a label to model options; ``lrs`` a (label, arm) (``standard`` included)
    to its own learning rate (absent: the profile's and task's)."""
    lrs = lrs or {}

    def train(label: str, arm: str) -> dict[str, Any] | None:
        return {"lr": lrs[(label, arm)]} if (label, arm) in lrs else None

    _, kind = task_info(task)
    base = base_model(p, **model_over)
    runs: list[Run] = []
    for seed in seeds or p.seeds:
        for arm in arms:
            runs.append(make_run(task, base, p, seed, {"design": "standard", "arm": arm},
                                 train=train("standard", arm)))
            for label, opts in designs.items():
                m = {**base, **opts}
                if arm == "matched":
                    m = matched(m, base, kind)
                runs.append(make_run(task, m, p, seed, {"design": label, "arm": arm},
                                     train=train(label, arm)))
    return runs
