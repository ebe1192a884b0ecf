"""Gauge-invariant similarity measures of W_Q, W_K, W_V per head, each with a random null.

A head is unchanged by (W_Q·A, W_K·A⁻ᵀ) for any invertible A and by (W_V·B, B⁻¹·W_O), so a raw
cosine between W_Q and W_K means nothing (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits"). Every weight measure here depends only on W_QK = W_Q·W_Kᵀ, W_OV =
W_V·W_O or the column spaces of W_Q, W_K, W_V in the residual stream, all invariant to those
maps, and all invariant to scale, so the null's init std does not matter.

Shapes: W_Q, W_K (H, D, dk), W_V (H, D, dv), W_O (H, dv, D); activations x (N, D). Every
measure returns one value per head, (H,).
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkvlab.analysis.heads import LayerView
from qkvlab.attention.circuits import FactoredMatrix
from qkvlab.attention.circuits import psd_sqrt as _psd_sqrt

WEIGHT_MEASURES = ("symmetry", "positive_share", "overlap_qk", "overlap_kv", "overlap_qv",
                   "eff_rank_qk", "eff_rank_ov", "copying")
CKA_MEASURES = ("cka_qk", "cka_kv", "cka_qv")
LAYER_MEASURES = ("symmetry_layer",)  # one value per layer, stored with head = -1
# one value per model and role, a statistic over its layers: summary records only, no rows
MODEL_MEASURES = ("symmetry_layer_median",)
MEASURES = WEIGHT_MEASURES + CKA_MEASURES + LAYER_MEASURES + MODEL_MEASURES
DESCRIPTIONS = {
    "symmetry": "s = (‖sym‖²−‖antisym‖²)/‖W_QK‖² (Saponati et al. 2025); tied Q=K gives 1",
    "positive_share": "Σλ₊/Σ|λ| over the eigenvalues of W_QK's symmetric part; tied Q=K gives 1",
    "overlap_qk": "mean cos² of the principal angles between the column spaces of W_Q and W_K",
    "overlap_kv": "mean cos² of the principal angles between the column spaces of W_K and W_V",
    "overlap_qv": "mean cos² of the principal angles between the column spaces of W_Q and W_V",
    "eff_rank_qk": "effective rank exp(H(σ/Σσ)) of W_QK (Roy & Vetterli 2007)",
    "eff_rank_ov": "effective rank exp(H(σ/Σσ)) of W_OV",
    "copying": "Σ Re λ / Σ|λ| over the eigenvalues of W_OV (Elhage et al. 2021, residual basis)",
    "cka_qk": "linear CKA of the head's q and k activations on real text",
    "cka_kv": "linear CKA of the head's k and v activations on real text",
    "cka_qv": "linear CKA of the head's q and v activations on real text",
    "note_cross": "cross-attention: Q reads the decoder stream, K and V the encoder's, so "
                  "symmetry, Q–K and Q–V overlaps and copying compare two different spaces; "
                  "values at the null are expected there, not evidence of anything",
    "symmetry_layer": "s of the whole layer's W_QK = Σ_h W_Q[h]·W_K[h]ᵀ (D×D), as Saponati et "
                      "al. 2025 compute it; one row per layer with head = -1",
    "symmetry_layer_median": "median over a role's layers of symmetry_layer: the statistic "
                             "Saponati et al. 2025 publish (weights only, no biases); one "
                             "summary record per role, its value in the field `mean`",
}

# Published symmetry s of W_QK, for display beside ours: per layer s of M = Σ_h W_Q[h]·W_K[h]ᵀ
# from the weights only, then the MEDIAN over layers (our symmetry_layer_median). Saponati et
# al. 2025, "The underlying structures of self-attention: symmetry, directionality, and emergent
# dynamics in Transformer training", arXiv:2502.10927, their table of language models and their
# _results/*.pkl (medians recomputed from those files). PUBLISHED, not measured here. Their ≈0
# for Llama-3-8B, Llama-3.2-1B and Mistral-7B are left out: artifacts of their code
# (DEVELOPERS.md, "Published symmetry values").
PUBLISHED_SYMMETRY = {
    "BERT-tiny": 0.77, "BERT-base": 0.51, "RoBERTa-base": 0.49, "ALBERT-base": 0.72,
    "GPT-2": 0.150, "Llama-2-7B": 0.12, "DINOv2-small": 0.486,
    "Whisper-tiny encoder": 0.504, "Whisper-tiny decoder": 0.170,
}
PUBLISHED_STATISTIC = "symmetry_layer_median"
PUBLISHED_SOURCE = "Saponati et al. 2025, arXiv:2502.10927"


# ---- weight measures ----------------------------------------------------------------------------
def symmetry_score(W_Q: Tensor, W_K: Tensor) -> Tensor:
    """s of M = W_Q·W_Kᵀ in [-1, 1] (H,), computed in the d×d space.

    ‖sym‖² − ‖antisym‖² = ⟨M, Mᵀ⟩ = tr(C·C) with C = W_Kᵀ·W_Q, and
    ‖M‖² = tr((W_QᵀW_Q)(W_KᵀW_K)), so the D×D matrix is never formed.
    """
    C = W_K.transpose(-1, -2) @ W_Q  # (H, dk, dk)
    num = (C * C.transpose(-1, -2)).sum((-1, -2))
    den = ((W_Q.transpose(-1, -2) @ W_Q) * (W_K.transpose(-1, -2) @ W_K)).sum((-1, -2))
    return num / den


def positive_share(W_Q: Tensor, W_K: Tensor) -> Tensor:
    """Σλ₊ / Σ|λ| over the eigenvalues of sym(W_QK) (H,): 1 for a PSD form, ≈½ at random.

    sym(M) = B·J·Bᵀ with B = [W_Q, W_K] and J = [[0, I/2], [I/2, 0]]; its nonzero
    eigenvalues are those of the 2dk×2dk matrix G^½·J·G^½ with G = BᵀB.
    """
    dk = W_Q.shape[-1]
    B = torch.cat([W_Q, W_K], dim=-1)
    S = _psd_sqrt(B.transpose(-1, -2) @ B)  # (H, 2dk, 2dk)
    J = torch.zeros(2 * dk, 2 * dk, dtype=W_Q.dtype)
    J[:dk, dk:] = J[dk:, :dk] = 0.5 * torch.eye(dk, dtype=W_Q.dtype)
    lam = torch.linalg.eigvalsh(S @ J @ S)
    return lam.clamp_min(0).sum(-1) / lam.abs().sum(-1)


# Batched QR of (H, D, d) is slow on CPU (seconds for 256 heads); every factorization below
# works on d×d Gram matrices instead, which float64 keeps accurate for these well-conditioned
# projections, and eigh handles rank-deficient (tied, pruned) heads by dropping null directions.
def _basis(W: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal basis of col(W[h]) (H, D, d), zero columns past its rank; and the ranks (H,)."""
    lam, V = torch.linalg.eigh(W.transpose(-1, -2) @ W)  # W = U·Σ·Vᵀ: U = W·V·Σ⁻¹
    keep = lam > lam[..., -1:].clamp_min(1e-300) * 1e-12
    inv = torch.where(keep, lam.clamp_min(1e-300).rsqrt(), torch.zeros_like(lam))
    return (W @ V) * inv[..., None, :], keep.sum(-1)


def subspace_overlap(A: Tensor, B: Tensor, _bases: tuple | None = None) -> Tensor:
    """Mean cos² of the principal angles between col(A[h]) and col(B[h]) (H,).

    1 for identical column spaces, 0 for orthogonal ones, ≈ d/D for random d-dim subspaces.
    """
    (Qa, ra), (Qb, rb) = _bases or (_basis(A), _basis(B))
    return (Qa.transpose(-1, -2) @ Qb).square().sum((-1, -2)) / torch.minimum(ra, rb)


def principal_cosines(A: Tensor, B: Tensor) -> Tensor:
    """Cosines of the principal angles, largest first (H, min(da, db))."""
    return torch.linalg.svdvals(_basis(A)[0].transpose(-1, -2) @ _basis(B)[0])


def effective_rank(sv: Tensor) -> Tensor:
    """exp(entropy of σ/Σσ) (…,), between 1 and the number of singular values."""
    p = sv / sv.sum(-1, keepdim=True)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-300))).sum(-1))


def copying_score(W_V: Tensor, W_O: Tensor) -> Tensor:
    """Σ Re λ / Σ|λ| over the eigenvalues of W_OV = W_V·W_O (H,): +1 copies what it reads.

    The nonzero eigenvalues of W_V·W_O (D×D) are those of W_O·W_V (dv×dv).
    """
    lam = torch.linalg.eigvals(W_O @ W_V)
    return lam.real.sum(-1) / lam.abs().sum(-1)


def weight_measures(W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor | None) -> dict[str, Tensor]:
    """Every weight measure, (H,) each; W_O None skips those that need it."""
    bq, bk, bv = _basis(W_Q), _basis(W_K), _basis(W_V)  # each basis once, not once per pair
    out = {"symmetry": symmetry_score(W_Q, W_K), "positive_share": positive_share(W_Q, W_K),
           "overlap_qk": subspace_overlap(W_Q, W_K, (bq, bk)),
           "overlap_kv": subspace_overlap(W_K, W_V, (bk, bv)),
           "overlap_qv": subspace_overlap(W_Q, W_V, (bq, bv)),
           "eff_rank_qk": effective_rank(
               FactoredMatrix(W_Q, W_K.transpose(-1, -2)).singular_values())}
    if W_O is not None:
        out["eff_rank_ov"] = effective_rank(FactoredMatrix(W_V, W_O).singular_values())
        out["copying"] = copying_score(W_V, W_O)
    return out


def layer_symmetry(W_Q: Tensor, W_K: Tensor) -> Tensor:
    """s of M = Σ_h W_Q[h]·W_K[h]ᵀ (D×D), shape (1,); one product, then two inner products."""
    H, D, dk = W_Q.shape
    Mx = W_Q.transpose(0, 1).reshape(D, H * dk) @ W_K.transpose(0, 1).reshape(D, H * dk).T
    return ((Mx * Mx.T).sum() / Mx.square().sum()).reshape(1)


def spectra(view: LayerView) -> dict[str, Tensor]:
    """Singular values of W_QK and W_OV per head, (H, dk) and (H, dv), largest first."""
    out = {"qk": view.QK.singular_values()}
    if view.W_O is not None:
        out["ov"] = view.OV.singular_values()
    return out


# ---- activation measures ---------------------------------------------------------------------
def linear_cka(X: Tensor, Y: Tensor) -> Tensor:
    """Linear CKA (Kornblith et al. 2019) of (…, N, p) and (…, N, q) -> (…,).

    Invariant to orthogonal maps and isotropic scaling of either side, not to every invertible
    map: read it against the null (random projections of the same inputs).
    """
    X = X - X.mean(-2, keepdim=True)
    Y = Y - Y.mean(-2, keepdim=True)
    xy = (Y.transpose(-1, -2) @ X).square().sum((-1, -2))
    xx = (X.transpose(-1, -2) @ X).square().sum((-1, -2)).sqrt()
    yy = (Y.transpose(-1, -2) @ Y).square().sum((-1, -2)).sqrt()
    return xy / (xx * yy)


def covariance(x: Tensor) -> Tensor:
    """Centered second moment (D, D) of inputs x (N, D); CKA needs nothing else of x."""
    xc = x - x.mean(0, keepdim=True)
    return xc.T @ xc / x.shape[0]


def cka_from_cov(C: Tensor, A: Tensor, B: Tensor) -> Tensor:
    """linear_cka(x·A, x·B) from C = covariance(x): ‖AᵀCB‖² / (‖AᵀCA‖·‖BᵀCB‖), (…,).

    Biases drop out with the centering, so q = x·W_Q + b_Q needs only W_Q. Costs D²·d per
    head instead of N·D·d plus N·d² for the activations.
    """
    return _cka_pairs(C, {"a": A, "b": B}, [("a", "b")])[("a", "b")]


def _cka_pairs(C: Tensor, W: dict[str, Tensor], pairs) -> dict[tuple, Tensor]:
    CW = {k: C @ w for k, w in W.items()}  # each C·W once, shared by the pairs
    norm = {k: (W[k].transpose(-1, -2) @ CW[k]).square().sum((-1, -2)).sqrt() for k in W}
    return {(a, b): (W[a].transpose(-1, -2) @ CW[b]).square().sum((-1, -2)) / (norm[a] * norm[b])
            for a, b in pairs}


def cka_measures(view: LayerView, x: Tensor, s: Tensor) -> dict[str, Tensor]:
    """CKA of q/k/v activations per head; q from x (N, D), k and v from s (M, D)."""
    Cs = covariance(s)
    if x is s or (x.shape == s.shape and torch.equal(x, s)):  # self-attention: same tokens
        r = _cka_pairs(Cs, {"q": view.W_Q, "k": view.W_K, "v": view.W_V},
                       [("q", "k"), ("k", "v"), ("q", "v")])
        return {f"cka_{a}{b}": v for (a, b), v in r.items()}
    return {"cka_kv": cka_from_cov(Cs, view.W_K, view.W_V)}


# ---- nulls ---------------------------------------------------------------------------------------
def weight_null(H: int, D: int, dk: int, dv: int, n: int, gen: torch.Generator,
                with_o: bool = True) -> dict[str, Tensor]:
    """The weight measures of ``n`` random heads of the given shapes, i.i.d. Gaussian init.

    Independent W_Q, W_K, W_V, W_O per head: what "no relation between the three" looks like.
    """
    def g(*shape):
        return torch.randn(n, *shape, generator=gen, dtype=torch.float64)

    return weight_measures(g(D, dk), g(D, dk), g(D, dv), g(dv, D) if with_o else None)


def layer_null(H: int, D: int, dk: int, n: int, gen: torch.Generator) -> dict[str, Tensor]:
    """symmetry_layer of ``n`` random layers of H independent Gaussian heads."""
    W = torch.randn(2, n, H, D, dk, generator=gen, dtype=torch.float64)
    return {"symmetry_layer": torch.cat([layer_symmetry(W[0, i], W[1, i]) for i in range(n)])}


def median_null(layer_sample: Tensor, n_layers: int, n: int, gen: torch.Generator) -> Tensor:
    """The null of a median over ``n_layers`` random layers, (n,): medians of ``n`` sets of
    ``n_layers`` values drawn with replacement from a per-layer null sample (1-D).

    Drawing n × n_layers D×D products anew costs minutes on a large model; the per-layer
    sample already holds independent random layers of the same shapes, so resampling it gives
    the median's distribution up to the sample's own granularity.
    """
    idx = torch.randint(len(layer_sample), (n, n_layers), generator=gen)
    return median(layer_sample[idx])


def median(v: Tensor) -> Tensor:
    """Median over the last dim, the mean of the two middle values for an even count (numpy's
    convention, which Saponati et al. use; ``torch.median`` would return the lower one)."""
    return torch.quantile(v, 0.5, dim=-1)


def cka_null(x: Tensor, A: Tensor, B: Tensor) -> dict[str, Tensor]:
    """CKA of random projection pairs (A[i], B[i]) of the same inputs x (N, D), (n,).

    A, B: i.i.d. Gaussian (n, D, dk), (n, D, dv), drawn once and shared by every layer. A
    Gaussian matrix is rotation invariant, so in the eigenbasis of C = covariance(x) the pair
    is still Gaussian: the null needs only C's eigenvalues (exact in distribution).
    """
    lam = torch.linalg.eigvalsh(covariance(x)).clamp_min(0)  # (D,)
    LA, LB = lam[:, None] * A, lam[:, None] * B
    ab = (A.transpose(-1, -2) @ LB).square().sum((-1, -2))
    aa = (A.transpose(-1, -2) @ LA).square().sum((-1, -2)).sqrt()
    bb = (B.transpose(-1, -2) @ LB).square().sum((-1, -2)).sqrt()
    val = ab / (aa * bb)
    return {m: val for m in CKA_MEASURES}


def summarize(null: Tensor) -> dict[str, float]:
    """mean, std and the central 95% interval of a null sample (1-D)."""
    null = null[torch.isfinite(null)]
    if not null.numel():
        raise ValueError("random null: every sample is NaN or infinite (degenerate weights or "
                         "activations, e.g. all zeros)")
    lo, hi = torch.quantile(null, torch.tensor([0.025, 0.975], dtype=null.dtype)).tolist()
    return {"null_mean": null.mean().item(), "null_std": null.std().item(),
            "null_lo": lo, "null_hi": hi, "null_n": int(null.numel())}
