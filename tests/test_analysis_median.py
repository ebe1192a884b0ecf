"""symmetry_layer_median, Saponati et al.'s published statistic, against a float64 hand
computation on a tiny random model: per layer s of M = Σ_h W_Q[h]·W_K[h]ᵀ, then numpy's median
over the role's layers (the mean of the two middle values for an even count)."""

from __future__ import annotations

import numpy as np
import torch

from qkvlab.analysis import analyze
from qkvlab.analysis import measures as M
from qkvlab.analysis.heads import LayerView, ModelView

H, D, DK = 3, 8, 4
LAYERS = {"encoder": 4, "decoder": 3}  # an even and an odd count


def _view(tied: bool = False) -> ModelView:
    gen = torch.Generator().manual_seed(1)
    layers = []
    for role, n in LAYERS.items():
        for layer in range(n):
            W_Q, W_K, W_V = (torch.randn(H, D, DK, generator=gen, dtype=torch.float64)
                             for _ in range(3))
            layers.append(LayerView(layer, role, W_Q, W_Q if tied else W_K, W_V,
                                    torch.randn(H, DK, D, generator=gen, dtype=torch.float64),
                                    name=f"{role}.{layer}"))
    return ModelView("tiny", "test", "memory", layers)


def _by_hand(view: ModelView) -> dict[str, np.ndarray]:
    """Per role, s of every layer as Saponati et al. write it: 2·‖sym M‖²/‖M‖² − 1."""
    out: dict[str, list[float]] = {}
    for lay in view.layers:
        Wq, Wk = lay.W_Q.numpy(), lay.W_K.numpy()
        Mx = sum(Wq[h] @ Wk[h].T for h in range(H))  # (D, D)
        sym = 0.5 * (Mx + Mx.T)
        out.setdefault(lay.role, []).append(2 * (sym ** 2).sum() / (Mx ** 2).sum() - 1)
    return {r: np.array(v) for r, v in out.items()}


def test_median_over_layers_matches_the_hand_computation():
    view = _view()
    res = analyze(view, None, n_null=16, cka=False, figures=False, progress=False)
    hand = _by_hand(view)
    summ = {(s["role"], s["measure"]): s for s in res["summary"]}
    for role, s in hand.items():
        rows = [r["value"] for r in res["rows"]
                if r["role"] == role and r["measure"] == "symmetry_layer"]
        torch.testing.assert_close(torch.tensor(rows, dtype=torch.float64), torch.tensor(s),
                                   rtol=0, atol=1e-12)
        med = summ[(role, "symmetry_layer_median")]
        assert med["n_heads"] == LAYERS[role] and med["std"] == 0.0
        # the mean over layers stays what it was, beside the median
        assert abs(summ[(role, "symmetry_layer")]["mean"] - s.mean()) < 1e-12
    got = torch.tensor([summ[(r, "symmetry_layer_median")]["mean"] for r in hand],
                       dtype=torch.float64)
    want = torch.tensor([np.median(s) for s in hand.values()])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not any(r["measure"] == "symmetry_layer_median" for r in res["rows"])  # summary only


def test_even_count_takes_the_mean_of_the_middle_two():
    v = torch.tensor([[0.4, 0.1, 0.3, 0.2]], dtype=torch.float64)
    torch.testing.assert_close(M.median(v), torch.tensor([0.25], dtype=torch.float64))
    assert torch.median(v).item() == 0.2  # why torch.median is not used


def test_null_of_the_median_and_tied_heads():
    res = analyze(_view(tied=True), None, n_null=64, cka=False, figures=False, progress=False)
    summ = {(s["role"], s["measure"]): s for s in res["summary"]}
    for role, n in LAYERS.items():
        med = summ[(role, "symmetry_layer_median")]
        assert abs(med["mean"] - 1.0) < 1e-12  # W_Q = W_K: every layer symmetric
        assert med["share_above_null"] == 1.0 and med["share_below_null"] == 0.0
        null = torch.tensor(res["nulls"][f"{role}/symmetry_layer_median"])
        assert null.shape == (64,) and null.abs().max() < 0.5  # random layers: near 0
        # a median narrows the spread of the single-layer null it resamples
        assert null.std() <= torch.tensor(res["nulls"][f"{role}/symmetry_layer"]).std()


def test_median_null_resamples_the_layer_null():
    sample = torch.tensor([0.0, 1.0], dtype=torch.float64)
    null = M.median_null(sample, 3, 200, torch.Generator().manual_seed(0))
    assert null.shape == (200,) and set(null.tolist()) <= {0.0, 1.0}
    assert 0 < null.mean() < 1
