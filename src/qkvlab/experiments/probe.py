"""The scale probe: where must 1/√d_k sit? (Q1; the comment in seed 001 that gradients vanish
when the scale is not inside the softmax.)

At chosen steps (step 0 = the initial weights) the probe records, per attention layer:
    entropy        mean softmax entropy of a query row, nats (B, H, Tq rows averaged)
    norm_entropy   entropy / log(number of keys the row may see): 1 = uniform, 0 = one-hot
    saturated      share of rows whose largest weight exceeds ``sat`` (0.99): the softmax
                   Jacobian diag(p) - ppᵀ of such a row is ~0, so no gradient reaches Q and K
    grad_WQ, grad_WK   Frobenius norm of the loss gradient w.r.t. that layer's W_Q, W_K
                   (the rows of the fused ``W_in`` that hold them; tied designs: one block)
and the mean over layers under ``probe/<stat>``. Row 0 of a causal layer (one key, trivially
saturated) is left out of every row statistic.

Attention weights are obtained through ``need_weights=True`` by forward hooks, switched on only
at probed steps; other steps use the fused SDPA kernel as usual.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn


class ScaleProbe:
    """A trainer callback (``before_step`` / ``after_backward``) recording attention statistics.

    Args:
        model: any qkvlab model (``attention_layers()`` yields (name, role, Attention)).
        steps: steps at which to measure (the forward/backward of that step).
        sat: threshold on a row's largest weight for ``saturated``.
    """

    def __init__(self, model: nn.Module, steps: Iterable[int], sat: float = 0.99):
        if not 0.0 < sat < 1.0:
            raise ValueError(f"probe.sat: {sat} must be in (0, 1)")
        self.steps, self.sat, self.active = set(int(s) for s in steps), sat, False
        self.layers = list(model.attention_layers())
        self._stats: dict[str, dict[str, float]] = {}
        self._handles = []
        for name, role, att in self.layers:
            self._handles.append(att.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(att.register_forward_hook(self._make_post(name, role),
                                                           with_kwargs=True))

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    # ---- hooks -------------------------------------------------------------------------
    def _pre(self, module, args, kwargs):
        if self.active:
            kwargs = {**kwargs, "need_weights": True}
        return args, kwargs

    def _make_post(self, name: str, role: str):
        def post(module, args, kwargs, output):
            if not (self.active and isinstance(output, tuple)):
                return output
            out, weights = output
            self._stats[name] = row_stats(weights.detach().float(), causal=role == "decoder",
                                          sat=self.sat)
            return out
        return post

    # ---- trainer callback ------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        self.active = step in self.steps
        self._stats = {}

    def after_backward(self, step: int, model: nn.Module, batch) -> dict[str, float] | None:
        if not self.active:
            return None
        self.active = False
        out: dict[str, float] = {}
        for name, _, att in self.layers:
            st = dict(self._stats.get(name, {}))
            g = att.W_in.grad
            if g is not None:
                st["grad_WQ"] = g[att._slices[att.segment_of("q")]].float().norm().item()
                st["grad_WK"] = g[att._slices[att.segment_of("k")]].float().norm().item()
            for k, v in st.items():
                out[f"probe/{name}/{k}"] = v
        for k in ("entropy", "norm_entropy", "saturated", "grad_WQ", "grad_WK"):
            vals = [v for n, v in out.items() if n.endswith(f"/{k}")]
            if vals:
                out[f"probe/{k}"] = sum(vals) / len(vals)
        return out


def row_stats(w: Tensor, *, causal: bool, sat: float = 0.99) -> dict[str, float]:
    """Entropy, normalized entropy and saturated share of attention weights w (B, H, Tq, Tk).

    Causal rows: query i sees i+1 keys (queries aligned to the last Tq keys); row 0 is dropped.
    """
    B, H, Tq, Tk = w.shape
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)  # (B, H, Tq); 0·log 0 = 0
    if causal:
        n_keys = torch.arange(Tk - Tq + 1, Tk + 1, dtype=w.dtype, device=w.device)  # (Tq,)
    else:
        n_keys = torch.full((Tq,), float(Tk), dtype=w.dtype, device=w.device)
    keep = n_keys > 1  # a row with one key has entropy 0 and max weight 1 by construction
    if not bool(keep.any()):
        return {}
    ent, top = ent[..., keep], w.amax(-1)[..., keep]
    norm = ent / torch.log(n_keys[keep])
    return {"entropy": ent.mean().item(), "norm_entropy": norm.mean().item(),
            "saturated": (top > sat).float().mean().item()}

