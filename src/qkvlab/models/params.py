"""Parameter counts and parameter matching between designs.

``match_params`` makes "needs more parameters" measurable: it widens a design until its
parameter count equals a baseline's within a tolerance, so quality can be compared at equal
width *and* at equal parameters.
"""

from __future__ import annotations

import functools
import json

import torch
from torch import nn

from qkvlab.attention import Attention
from qkvlab.models.config import ROLES, ModelConfig
from qkvlab.models.io import build_model


def count_params(model: nn.Module) -> dict[str, int]:
    """``total`` (shared tensors once), ``embedding`` (token + position tables),
    ``non_embedding`` and ``attention`` (every attention module: projections, W_O, extras)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() yields a tied tensor once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding)
              for p in m.parameters())
    att = sum(p.numel() for m in model.modules() if isinstance(m, Attention)
              for p in m.parameters())
    return {"total": total, "embedding": emb, "non_embedding": total - emb, "attention": att}


def config_params(cfg: ModelConfig, kind: str = "decoder") -> dict[str, int]:
    """``count_params`` of the model a config builds, without allocating its weights."""
    return dict(_config_params(cfg.to_json(), kind))


@functools.lru_cache(maxsize=4096)
def _config_params(cfg_json: str, kind: str) -> tuple:
    cfg = ModelConfig.from_dict(json.loads(cfg_json))
    with torch.device("meta"):  # shapes only: no memory, no init cost
        return tuple(count_params(build_model(cfg, kind)).items())


def match_params(cfg: ModelConfig, target: int | ModelConfig, *, kind: str = "decoder",
                 by: str = "d_head", key: str = "total", tol: float = 0.01) -> ModelConfig:
    """Widen ``cfg`` until its ``key`` parameter count is within ``tol`` of ``target``.

    ``by="d_head"`` (default) changes the per-head width of every role, keeping the residual
    stream, embeddings and MLP as they are, so only the attention grows. ``by="d_model"``
    widens the residual stream (d_mlp follows as 4·d_model unless it was set apart; d_head
    follows d_model/n_heads unless set). If the best width is still off by more than ``tol``,
    ``d_mlp`` is adjusted to close the gap (documented in the returned config).

    Args:
        target: a parameter count, or a baseline config whose count is used.

    Raises:
        ValueError: unknown ``by``/``key``, or no width within tolerance.
    """
    if by not in ("d_head", "d_model"):
        raise ValueError(f"by: {by!r} is not one of ['d_head', 'd_model']")
    if key not in ("total", "non_embedding", "attention"):
        raise ValueError(f"key: {key!r} is not one of ['total', 'non_embedding', 'attention']")
    goal = config_params(target, kind)[key] if isinstance(target, ModelConfig) else int(target)
    if goal < 1:
        raise ValueError(f"target: {goal} must be a positive parameter count")

    def count(c: ModelConfig) -> int:
        return config_params(c, kind)[key]

    def widened(w: int) -> ModelConfig | None:
        try:
            if by == "d_head":
                roles = {r: {k: v for k, v in o.items() if k not in ("d_head", "d_v")}
                         for r, o in cfg.roles.items()}
                return cfg.replace(d_head=w, d_v=None, roles=roles)
            d_mlp_default = cfg.d_mlp == 4 * cfg.d_model
            return cfg.replace(d_model=w, d_mlp=4 * w if d_mlp_default else cfg.d_mlp)
        except ValueError:
            return None  # e.g. d_model not divisible by n_heads

    start = getattr(cfg, by) or cfg.attention(next(iter(ROLES))).d_head
    candidates = []
    for w in range(1, 8 * start + 1):
        c = widened(w)
        if c is not None:
            n = count(c)
            candidates.append((abs(n - goal), w, c))
            if n > goal * (1 + tol) and w > start:
                break
    if not candidates:
        raise ValueError(f"by: no valid {by} for this config")
    _, _, best = min(candidates, key=lambda t: t[0])
    if abs(count(best) - goal) <= tol * goal:
        return best
    # Close the remaining gap with the MLP width (a coarse d_model/d_head step can overshoot).
    lo, hi = 1, 16 * best.d_mlp
    while lo < hi:
        mid = (lo + hi) // 2
        if count(best.replace(d_mlp=mid)) < goal:
            lo = mid + 1
        else:
            hi = mid
    options = [best.replace(d_mlp=m) for m in (lo - 1, lo) if m >= 1]
    best = min(options, key=lambda c: abs(count(c) - goal))
    if abs(count(best) - goal) > tol * goal:
        raise ValueError(f"target: cannot match {goal} parameters within {tol:.0%} by {by}")
    return best
