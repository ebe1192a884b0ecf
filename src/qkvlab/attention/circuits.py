"""Low-rank products A·B kept factored: the QK and OV circuits of a head.

W_QK = W_Q·W_Kᵀ is D×D but has rank ≤ d_head; storing A (…, m, k) and B (…, k, n) keeps the
cost at O(D·d_head) and gives exact singular values from a k×k problem
(Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits").
"""

from __future__ import annotations

import torch
from torch import Tensor


class Circuits:
    """The QK and OV circuits of whatever has per-head ``W_Q, W_K, W_V, W_O`` (H, D, d)
    (``Attention``, ``LayerView``), as factored products."""

    @property
    def QK(self) -> "FactoredMatrix":
        """W_Q[h] · W_K[h]ᵀ (H, D, D): scores are x_i · QK · s_jᵀ (before scale, biases)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-1, -2))

    @property
    def OV(self) -> "FactoredMatrix":
        """W_V[h] · W_O[h] (H, D, D): what a fully attended token writes to the residual."""
        return FactoredMatrix(self.W_V, self.W_O)


def psd_sqrt(G: Tensor) -> Tensor:
    """The symmetric square root of positive semidefinite matrices G (…, k, k)."""
    lam, V = torch.linalg.eigh(G)
    return (V * lam.clamp_min(0).sqrt()[..., None, :]) @ V.transpose(-1, -2)


class FactoredMatrix:
    """The product A @ B with batch dims in front (one matrix per head)."""

    def __init__(self, A: Tensor, B: Tensor):
        if A.shape[-1] != B.shape[-2] or A.shape[:-2] != B.shape[:-2]:
            raise ValueError(f"FactoredMatrix: shapes {tuple(A.shape)} @ {tuple(B.shape)} "
                             "do not chain")
        self.A, self.B = A, B

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.A.shape[:-1], self.B.shape[-1]))

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def full(self) -> Tensor:
        """The dense product (…, m, n)."""
        return self.A @ self.B

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """Thin SVD U (…, m, r), S (…, r), Vh (…, r, n) with r = inner dim, via two QRs."""
        Qa, Ra = torch.linalg.qr(self.A)  # A = Qa Ra
        Qb, Rb = torch.linalg.qr(self.B.transpose(-1, -2))  # Bᵀ = Qb Rb
        U, S, Vh = torch.linalg.svd(Ra @ Rb.transpose(-1, -2))
        return Qa @ U, S, Vh @ Qb.transpose(-1, -2)

    def singular_values(self) -> Tensor:
        """σ(A·B) (…, k), largest first, without the factors: σ² are the eigenvalues of
        (AᵀA)^½·(B·Bᵀ)·(AᵀA)^½, a k×k problem (what the analysis measures read)."""
        S = psd_sqrt(self.A.transpose(-1, -2) @ self.A)
        lam = torch.linalg.eigvalsh(S @ (self.B @ self.B.transpose(-1, -2)) @ S)
        return lam.clamp_min(0).sqrt().flip(-1)

    def norm(self) -> Tensor:
        """Frobenius norm per matrix (…): ‖AB‖² = tr((AᵀA)(BBᵀ))."""
        return ((self.A.transpose(-1, -2) @ self.A)
                * (self.B @ self.B.transpose(-1, -2))).sum((-1, -2)).clamp_min(0).sqrt()

    def __getitem__(self, idx) -> "FactoredMatrix":
        return FactoredMatrix(self.A[idx], self.B[idx])

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.A.shape[-1]})"
