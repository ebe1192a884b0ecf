"""Impose a Q/K/V tie on a trained Hugging Face decoder, each tie fitted on real activations.

Shapes (one attention module; HF names translated at the top of each function):
  d_model   input width (``hidden_size``);  D = d_model + 1 when the projections have biases
            (an input x is read as x̂ = [x, 1], a weight row as [w, b])
  n_heads, n_kv_heads, d_head; n_rep = n_heads // n_kv_heads q heads read kv head g
  W_Q  q_proj.weight [n_heads*d_head, d_model],  W_K, W_V  [n_kv_heads*d_head, d_model]
  W_O  o_proj.weight [d_model, n_heads*d_head];  C = E[x̂ x̂ᵀ]  [D, D], per layer, float64

Ties (``KINDS``) and what each forces; everything else is refitted so the cost is the least the
tie allows on the calibration text's activations:

- ``kv`` (K=V): per kv head g, V is replaced by K·M_g with M_g = argmin ‖K M − V‖² over the
  calibration tokens (least squares; the same M also minimises the error after W_O, since M
  is unconstrained), and M_g is folded into W_O of the q heads reading g (W_O,h ← W_O,h M_gᵀ),
  so ``v_proj.weight`` becomes the very Parameter ``k_proj.weight`` (and bias). Exact: the fold
  of M into W_O. Forced: span(W_V,g) ⊆ span(W_K,g) per head. Rotary: HF rotates the *output*
  of ``k_proj`` inside ``forward`` and never rotates values, so the shared projection gives
  v = the pre-rotary k (which is what "V = K" must mean: a rotated v would mix positions into
  the values). No new module is needed, the tied model is an ordinary HF model.
- ``qk`` (Q=K): the head's score form x̂ᵀ W_Qᵀ R_(j−i) W_K x̂' can keep only a positive
  semidefinite Hermitian form per rotary plane. With HF's rotate_half convention, dims p and
  p + d_head/2 are one plane, read as the complex number z = c·x̂ (c = row p + i·row p+d_head/2);
  rotation multiplies z by e^(iφ) and the score is Re(conj(z_q) z_k e^(iΔφ)), i.e. the form
  H = conj(c_q) c_kᵀ. The gauge that commutes with rotary is one complex scalar per plane;
  up to it, Q = K means H = conj(c) cᵀ. We take the nearest such form in the metric of the
  activations, ‖C^½ (H − conj(c)cᵀ) C^½‖_F (all query/key token pairs), which is the top
  eigenpair of the Hermitian part of C^½ H C^½ (rank ≤ 2, solved in closed form).
  GQA: n_rep q heads share one kv head, and a real parameter tie (no new K heads, no bigger
  KV cache) makes them share its projection: q_h = k_g for every h reading g. Their H_h are
  averaged (the nearest common form is the nearest to their mean), so the n_rep heads of a
  group attend identically and differ only by their W_O: the tie costs the group's distinct
  patterns as well as the asymmetry. ``q_proj`` becomes :class:`SharedQuery`, which holds
  ``k_proj`` itself and repeats its heads (with n_rep = 1 the Parameter is assigned directly).
- ``qkv``: ``qk``, then ``kv`` fitted against the new K: one Parameter serves Q, K and V.
- ``gqa`` (reference, not a tie): kv heads merged, ``n_kv_heads`` → ``kv_heads``, by
  mean-pooling their W_K and W_V (Ainslie et al., "GQA", 2023; needs no calibration) or, from
  the ``fitted`` start, with the keys mean-pooled and the values fitted (``hf.merge``).
- ``alt`` is not offered: its fold into standard attention is exact, so it costs a trained
  model nothing (see ``qkvlab.models.fold``).

Per model family: Llama/Mistral/SmolLM (no biases) and Qwen2 (biases on Q, K, V, none on O:
fits use x̂ = [x, 1] so a shared Linear shares the bias too; a constant left over by the K=V
fit has no O bias to go to and counts as cost). Gemma-3 normalises q and k per head with two
RMSNorms after projection: K=V still means v = the raw (pre-norm, pre-rotary) k and ``kv`` and
``gqa`` apply unchanged; Q=K would give q and k the same raw projection but different norm
scales, and the fit above ignores the norm's nonlinearity, so ``qk``/``qkv`` refuse Gemma-3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkvlab.hf.merge import merge_kv_heads
from qkvlab.hf.projections import (  # noqa: F401 (TieError, TieRefused, SharedQuery: the API)
    SharedQuery,
    TieError,
    TieRefused,
    _metric,
    _rows,
    _shape,
    _write,
)

KINDS = ("kv", "qk", "qkv", "gqa")
# How a tie's shared projection starts (``tie(..., start=)``): ``fitted`` is the least-squares fit
# above; ``avg`` (W_K + W_V)/2, ``keep_k`` W_K, ``keep_v`` W_V are Kayyam et al.'s naive K=V
# starts (nothing folded into W_O); ``mean_pool`` is Ainslie et al.'s GQA conversion, GQA's
# default, and GQA's ``fitted`` start fits the values (``hf.merge``).
STARTS = {"kv": ("fitted", "avg", "keep_k", "keep_v"), "qk": ("fitted",), "qkv": ("fitted",),
          "gqa": ("mean_pool", "fitted")}
FAMILIES = {"llama": KINDS, "mistral": KINDS, "qwen2": KINDS, "gemma3_text": ("kv", "gqa")}


@dataclass
class Calibration:
    """Per layer second moment C = E[x̂ x̂ᵀ] of the attention input, x̂ = [x, 1], float64 [D, D]."""
    moments: list[torch.Tensor]
    n_tokens: int


# ---- model checks and calibration -------------------------------------------------------------
def _family(model: nn.Module) -> str:
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    mtype = (getattr(getattr(cfg, "text_config", None), "model_type", mtype) if mtype == "gemma3"
             else mtype)
    if mtype not in FAMILIES:
        raise TieError(f"model: model_type {mtype!r} is not supported; "
                       f"supported: {sorted(FAMILIES)}")
    return mtype


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of an HF causal LM (``model.model.layers``)."""
    _family(model)
    inner = getattr(model, "model", model)
    layers = (getattr(inner, "layers", None)
              or getattr(getattr(inner, "language_model", None), "layers", None))
    if layers is None:
        raise TieError(f"model: {type(model).__name__} has no decoder layers at .model.layers")
    return layers


@torch.no_grad()
def calibrate(model: nn.Module, input_ids: torch.Tensor, batch: int = 4) -> Calibration:
    """Per-layer second moments of the attention input on ``input_ids`` [B, T] (no padding)."""
    if (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
            or input_ids.dtype != torch.long):
        raise TieError(f"calibration: expected a LongTensor [batch, seq] of token ids, got "
                       f"{type(input_ids).__name__} {getattr(input_ids, 'shape', '')}")
    layers = decoder_layers(model)
    d = layers[0].self_attn.k_proj.in_features
    moments = [torch.zeros(d + 1, d + 1, dtype=torch.float64) for _ in layers]

    def hook(i):
        def pre(module, args, kwargs):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            x = x.reshape(-1, d).double()
            xh = torch.cat([x, x.new_ones(len(x), 1)], 1)
            moments[i] += (xh.T @ xh).cpu()  # the fits run on the CPU, in float64
        return pre

    handles = [layer.self_attn.register_forward_pre_hook(hook(i), with_kwargs=True)
               for i, layer in enumerate(layers)]
    try:
        for s in range(0, len(input_ids), batch):
            model(input_ids=input_ids[s:s + batch], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    n = input_ids.numel()
    return Calibration([m / n for m in moments], n)


# ---- the fits (float64, on one attention module; rows and shapes: ``hf.projections``) -------
def fit_kv(attn: nn.Module, C: torch.Tensor) -> torch.Tensor:
    """M [n_kv, d_head, d_head]: least squares of V on K under C (V ≈ K M_g per kv head)."""
    n_heads, n_kv, d_head = _shape(attn)
    C = _metric(attn, C)
    K, V = _rows(attn.k_proj).view(n_kv, d_head, -1), _rows(attn.v_proj).view(n_kv, d_head, -1)
    A, B = K @ C @ K.transpose(1, 2), K @ C @ V.transpose(1, 2)   # KᵀK, KᵀV per head
    return torch.linalg.lstsq(A, B, driver="gelsd").solution


def naive_kv(attn: nn.Module, start: str) -> None:
    """K=V without a fit: the shared projection is (W_K + W_V)/2 (``avg``), W_K (``keep_k``) or
    W_V (``keep_v``), biases alike; W_O is left as it is (Kayyam et al.'s conversions)."""
    k, v = attn.k_proj, attn.v_proj
    rows = {"avg": (_rows(k) + _rows(v)) / 2, "keep_k": _rows(k), "keep_v": _rows(v)}[start]
    _write(k, rows)
    attn.v_proj.weight = attn.k_proj.weight
    if attn.v_proj.bias is not None:
        attn.v_proj.bias = attn.k_proj.bias


def fold_kv(attn: nn.Module, M: torch.Tensor) -> None:
    """W_O,h ← W_O,h M_gᵀ for each q head h of kv head g; then v_proj shares k_proj's Parameters."""
    n_heads, n_kv, d_head = _shape(attn)
    W_O = (attn.o_proj.weight.detach().double().cpu()
           .view(-1, n_heads, d_head))                                      # [d_model, h, d_head]
    M_h = M.repeat_interleave(n_heads // n_kv, 0)                           # [h, d_head, d_head]
    attn.o_proj.weight.data.copy_(torch.einsum("dhe,hfe->dhf", W_O, M_h).reshape(
        attn.o_proj.weight.shape).to(attn.o_proj.weight))
    attn.v_proj.weight = attn.k_proj.weight
    if attn.v_proj.bias is not None:
        attn.v_proj.bias = attn.k_proj.bias


def _sqrt_pair(C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C^½ and the pseudo-inverse C^-½ (directions with no activation variance are dropped)."""
    s, U = torch.linalg.eigh(C)
    keep = s > s.max() * 1e-12
    r = torch.where(keep, s.clamp_min(0).sqrt(), torch.zeros_like(s))
    ri = torch.where(keep, 1 / r.where(keep, torch.ones_like(r)), torch.zeros_like(s))
    return (U * r) @ U.T, (U * ri) @ U.T


def _whitened_qk(attn: nn.Module, C: torch.Tensor):
    """(a [g, r, plane, D], b [g, plane, D], C^-½): a_h = C^½ conj(c_q,h), b = C^½ conj(c_k),
    so the whitened score form of q head h in plane p is a bᴴ."""
    n_heads, n_kv, d_head = _shape(attn)
    n_rep, half = n_heads // n_kv, d_head // 2
    root, inv_root = (m.to(torch.complex128) for m in _sqrt_pair(_metric(attn, C)))
    Q = _rows(attn.q_proj).view(n_kv, n_rep, d_head, -1)
    K = _rows(attn.k_proj).view(n_kv, d_head, -1)
    cq = torch.complex(Q[:, :, :half], Q[:, :, half:])                       # [g, r, plane, D]
    ck = torch.complex(K[:, :half], K[:, half:])                            # [g, plane, D]
    return cq.conj() @ root, ck.conj() @ root, inv_root


def _nearest_tied(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """w [..., D] with w wᴴ the nearest PSD rank-1 Hermitian form to a bᴴ (Frobenius).

    The Hermitian part of a bᴴ lives in span{a, b}: its top eigenpair is a 2×2 problem.
    """
    basis, _ = torch.linalg.qr(torch.stack([a, b], -1))                    # [..., D, 2]
    pa = basis.conj().transpose(-1, -2) @ a[..., None]                     # [..., 2, 1]
    pb = basis.conj().transpose(-1, -2) @ b[..., None]
    S = pa @ pb.conj().transpose(-1, -2)
    lam, vec = torch.linalg.eigh((S + S.conj().transpose(-1, -2)) / 2)
    return lam[..., -1:].clamp_min(0).sqrt() * (basis @ vec[..., -1:])[..., 0]


def fit_qk(attn: nn.Module, C: torch.Tensor) -> torch.Tensor:
    """The shared rows [n_kv*d_head, D] nearest (under C) to each group's score forms; see module
    doc."""
    n_heads, n_kv, d_head = _shape(attn)
    a, b, inv_root = _whitened_qk(attn, C)
    w = _nearest_tied(a.mean(1), b)          # nearest to the mean form
                                             # = nearest to all of the group
    c = w.conj() @ inv_root                  # C^-½ c̃ with c̃ = conj(w); [g, plane, D]
    return torch.cat([c.real, c.imag], 1).reshape(n_kv * d_head, -1)


def fit_residuals(attn: nn.Module, C: torch.Tensor) -> dict[str, float]:
    """Share of the activation-weighted signal each fit leaves out (0 = the tie is exact here).

    ``kv``: ‖K M − V‖² / ‖V‖² over the calibration tokens. ``qk_group``: the imposed Q=K (one
    form per kv group), ‖H_h − G‖² / ‖H_h‖² summed over q heads and rotary planes, in the metric
    C ⊗ C of all token pairs. ``qk_head``: the same if each q head could keep its own tied form,
    i.e. only the asymmetry of W_QK; the gap to ``qk_group`` is what GQA's sharing adds.
    """
    n_heads, n_kv, d_head = _shape(attn)
    Cm = _metric(attn, C)
    K, V = _rows(attn.k_proj).view(n_kv, d_head, -1), _rows(attn.v_proj).view(n_kv, d_head, -1)
    E = fit_kv(attn, C).transpose(1, 2) @ K - V                            # rows of K M − V
    kv = (torch.einsum("gid,de,gie->", E, Cm, E) / torch.einsum("gid,de,gie->", V, Cm, V)).item()
    a, b, _ = _whitened_qk(attn, C)
    b = b[:, None].expand_as(a)

    def dot(x, y):
        return (x.conj() * y).sum(-1)

    def left(w):  # ‖a bᴴ − w wᴴ‖² = |a|²|b|² + |w|⁴ − 2 Re((aᴴw)(wᴴb)), summed
        return (dot(a, a).real * dot(b, b).real + dot(w, w).real ** 2
                - 2 * (dot(a, w) * dot(w, b)).real).sum()

    total = (a.abs().square().sum(-1) * b.abs().square().sum(-1)).sum()
    group = _nearest_tied(a.mean(1), b[:, 0])[:, None].expand_as(a)
    return {"kv": kv, "qk_group": (left(group) / total).item(),
            "qk_head": (left(_nearest_tied(a, b)) / total).item()}


def tie_qk(attn: nn.Module, C: torch.Tensor) -> None:
    """Refit K (see :func:`fit_qk`) and make q_proj read k_proj's Parameters."""
    n_heads, n_kv, d_head = _shape(attn)
    _write(attn.k_proj, fit_qk(attn, C))
    if n_heads == n_kv:
        attn.q_proj.weight = attn.k_proj.weight
        if attn.q_proj.bias is not None:
            attn.q_proj.bias = attn.k_proj.bias
    else:
        attn.q_proj = SharedQuery(attn.k_proj, n_heads // n_kv, d_head)


def _calibration(model: nn.Module, calibration, kind: str, n_layers: int) -> Calibration:
    if calibration is None:
        raise TieError(f"calibration: tie {kind!r} is fitted on activations; "
                       "pass token ids or a Calibration")
    cal = calibration if isinstance(calibration, Calibration) else calibrate(model, calibration)
    if len(cal.moments) != n_layers:
        raise TieError(f"calibration: has {len(cal.moments)} layers, the model {n_layers}")
    return cal


# ---- the public entry point ------------------------------------------------------------------
def check(model: nn.Module, kind: str, kv_heads: int = 1, start: str | None = None) -> str:
    """Raise what :func:`tie` would raise for these arguments, changing nothing; the start used."""
    if kind not in KINDS:
        raise TieError(f"kind: {kind!r} is not one of {list(KINDS)} ('alt' folds exactly into "
                       f"standard attention, so it has no cost to measure)")
    family = _family(model)
    if kind not in FAMILIES[family]:
        raise TieRefused(f"kind: {kind!r} is not supported for {family} (its q/k RMSNorms make Q=K "
                       f"a nonlinear fit); supported: {list(FAMILIES[family])}")
    start = STARTS[kind][0] if start is None else start
    if start not in STARTS[kind]:
        raise TieError(f"start: {start!r} is not a start of tie {kind!r}; "
                       f"choose from {list(STARTS[kind])}")
    if kind == "gqa":
        n_kv = model.config.num_key_value_heads
        if n_kv == 1:
            raise TieRefused("gqa: the model already has a single kv head (MQA); there are no kv "
                             "heads to merge")
        if kv_heads >= n_kv or n_kv % kv_heads:
            raise TieError(f"kv_heads: {kv_heads} must divide the model's {n_kv} kv heads and be "
                           "fewer")
    return start


def tie(model: nn.Module, kind: str, calibration: torch.Tensor | Calibration | None = None,
        layers: list[int] | None = None, kv_heads: int = 1, start: str | None = None) -> nn.Module:
    """Impose tie ``kind`` (``KINDS``) in place on ``layers`` (default all) and return ``model``.

    ``start``: how the shared projection starts (``STARTS[kind]``; default the first, the fit,
    or mean-pooling for ``gqa``). Only ``fitted`` needs a calibration.

    ``calibration``: token ids [B, T] or a :class:`Calibration` from :func:`calibrate` (reuse
    one for many ties); required except for ``gqa``. ``kv_heads``: target of ``gqa``.
    Raises:
        TieRefused: the model's architecture cannot take this tie (see the class).
        TieError: unknown kind or model type, missing calibration, layer index out of range, a
            layer already tied.
    """
    start = check(model, kind, kv_heads, start)
    all_layers = decoder_layers(model)
    layers = list(range(len(all_layers))) if layers is None else list(layers)
    bad = [i for i in layers if not 0 <= i < len(all_layers)]
    if bad:
        raise TieError(f"layers: {bad} out of range for a model with {len(all_layers)} layers")
    if kind == "gqa":
        cal = None
        if start == "fitted":
            cal = _calibration(model, calibration, kind, len(all_layers))
        with torch.no_grad():
            for i in layers:
                merge_kv_heads(all_layers[i].self_attn, kv_heads,
                               None if cal is None else cal.moments[i])
        if len(layers) == len(all_layers):
            model.config.num_key_value_heads = kv_heads
        return model
    if start != "fitted":
        with torch.no_grad():
            for i in layers:
                attn = all_layers[i].self_attn
                if attn.v_proj.weight is attn.k_proj.weight:
                    raise TieError(f"layers: layer {i} is already tied; tie a fresh model")
                naive_kv(attn, start)
        return model
    cal = _calibration(model, calibration, kind, len(all_layers))
    with torch.no_grad():
        for i in layers:
            attn, C = all_layers[i].self_attn, cal.moments[i]
            if isinstance(attn.q_proj, SharedQuery) or attn.v_proj.weight is attn.k_proj.weight:
                raise TieError(f"layers: layer {i} is already tied; tie a fresh model")
            if kind in ("qk", "qkv"):
                tie_qk(attn, C)
            if kind in ("kv", "qkv"):
                fold_kv(attn, fit_kv(attn, C))
    return model
