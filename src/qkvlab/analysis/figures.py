"""Figures of an ``analyze`` result, one function each, written as PNG and SVG.

- :func:`plot_heatmaps`: layer × head heatmaps, one row per role, one column per measure;
  the title gives the null's mean and 95% interval so a colour reads against chance.
- :func:`plot_distributions`: per measure, the heads' values per role against the null.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHOWN = ("symmetry", "symmetry_layer", "positive_share", "overlap_qk", "overlap_kv", "overlap_qv",
         "copying", "eff_rank_qk", "cka_qk", "cka_kv", "cka_qv")
ROLE_COLORS = {"encoder": "tab:blue", "decoder": "tab:red", "cross": "tab:green"}


def _plt():
    import matplotlib  # lazy: optional extra [report]; tables need no matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    # SVG text as <text>, not glyph paths: several times faster to write, and still editable
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    return plt


def _save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    # Fixed margins, no tight/constrained layout: the layout engines measured every tick
    # label's box and took most of the time on this CPU.
    fig.savefig(paths[0], dpi=110)
    fig.savefig(paths[1])
    _plt().close(fig)
    return paths


def _roles(result: dict) -> list[str]:
    """Roles in reading order: encoder, decoder, cross."""
    return [r for r in ("encoder", "decoder", "cross") if r in result["meta"]["roles"]]


def _grid(result: dict, role: str, measure: str) -> np.ndarray | None:
    rows = [r for r in result["rows"]
            if r["role"] == role and r["measure"] == measure and r["head"] >= 0]
    if not rows:
        return None
    L = max(r["layer"] for r in rows) + 1
    H = max(r["head"] for r in rows) + 1
    g = np.full((L, H), np.nan)
    for r in rows:
        g[r["layer"], r["head"]] = r["value"]
    return g


def plot_heatmaps(result: dict, stem: Path) -> list[Path]:
    """Layer × head heatmaps (rows: roles; columns: measures) -> [png, svg]."""
    from matplotlib.ticker import MaxNLocator  # lazy: optional extra [report]

    plt = _plt()
    roles = _roles(result)
    present = {r["measure"] for r in result["rows"]}
    measures = [m for m in SHOWN if m in present and m not in ("symmetry_layer", "eff_rank_qk")]
    summ = {(s["role"], s["measure"]): s for s in result["summary"]}
    # Legible at laptop width: one column per role (three columns when there is one role),
    # one row per measure, instead of one very wide row.
    ncol = len(roles) if len(roles) > 1 else 3
    panels = [(m, role) for m in measures for role in roles]
    nrow = -(-len(panels) // ncol)
    height = 2.6 * nrow + 0.8
    fig, axes = plt.subplots(nrow, ncol, squeeze=False, figsize=(3.4 * ncol, height))
    fig.subplots_adjust(left=0.07, right=0.95, bottom=0.45 / height, top=1 - 0.95 / height,
                        wspace=0.45, hspace=0.8)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for m in measures:
        grids = {role: _grid(result, role, m) for role in roles}
        vals = np.concatenate([g[np.isfinite(g)] for g in grids.values() if g is not None])
        lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
        for role in roles:
            ax = axes.flat[panels.index((m, role))]
            g = grids[role]
            if g is None:
                ax.axis("off")
                continue
            im = ax.imshow(g, aspect="auto", cmap="viridis", vmin=lo, vmax=hi,
                           interpolation="nearest")
            s = summ[(role, m)]
            ax.set_title(f"{role}: {m}\nnull {s['null_mean']:.2f} "
                         f"[{s['null_lo']:.2f}, {s['null_hi']:.2f}]", fontsize=8)
            ax.set_xlabel("head", fontsize=8)
            ax.set_ylabel("layer", fontsize=8)
            ax.tick_params(labelsize=7)
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(MaxNLocator(integer=True))
            # one colour scale per measure, shared by the roles
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    fig.suptitle(f"{result['model']}: per-head measures (layer × head)", fontsize=9)
    return _save(fig, stem)


def plot_distributions(result: dict, stem: Path) -> list[Path]:
    """Histograms of the heads' values per role against the null (grey) -> [png, svg]."""
    plt = _plt()
    present = {r["measure"] for r in result["rows"]}
    measures = [m for m in SHOWN if m in present]
    ncol = min(5, len(measures))
    nrow = -(-len(measures) // ncol)
    fig, axes = plt.subplots(nrow, ncol, squeeze=False, figsize=(3.0 * ncol, 2.4 * nrow + 0.4))
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.08, top=0.88, wspace=0.3, hspace=0.55)
    for ax in axes.flat[len(measures):]:
        ax.axis("off")
    for ax, m in zip(axes.flat, measures):
        vals = {role: np.array([r["value"] for r in result["rows"]
                                if r["role"] == role and r["measure"] == m])
                for role in _roles(result)}
        nulls = [np.asarray(v) for k, v in result["nulls"].items() if k.endswith(f"/{m}")]
        allv = np.concatenate([v for v in vals.values() if v.size] + nulls)
        bins = np.linspace(np.nanmin(allv), np.nanmax(allv) + 1e-12, 40)
        if nulls:
            ax.hist(np.concatenate(nulls), bins=bins, density=True, color="0.75", label="null")
        for role, v in vals.items():
            if v.size:
                ax.hist(v, bins=bins, density=True, histtype="step", lw=1.5,
                        color=ROLE_COLORS.get(role), label=role)
        ax.set_title(m, fontsize=8)
        ax.tick_params(labelsize=6)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{result['model']}: heads vs random null of the same shapes", fontsize=9)
    return _save(fig, stem)
