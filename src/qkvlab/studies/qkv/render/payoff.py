"""Q3's payoff curve: decode tokens/s against context per cache layout, beside the memory bound,
from the bench's stored rows for this CPU where they exist (``compute.payoff.kv_payoff``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from qkvlab.report.blocks import Figure
from qkvlab.studies.qkv.compute.payoff import KV_AGREE, kv_agreement, kv_payoff
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan.vocab import DESIGNS, color, label
from qkvlab.studies.qkv.render.figures_q import save

# The payoff curve's GQA/MQA layouts, which have no design row (gqa_4: n_kv = n_heads/2 of 8
# heads, gqa_half's layout, so its color)
KV_LAYOUT_COLORS = {"gqa_4": color("gqa_half"), "gqa_2": "#882255", "mqa": "#555555"}


def fig_q3_kv_payoff(data: StudyData, out: Path) -> Figure | None:
    """Where K=V pays: decode tokens/s against context per cache layout, with the memory bound."""
    kv = kv_payoff(data)
    if kv.empty:
        return None
    batches = sorted(kv.batch.unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.6), squeeze=False)
    for ax, B in zip(axes[0], batches):
        for i, d in enumerate(dict.fromkeys(kv.design)):
            r = kv[(kv.design == d) & (kv.batch == B)].sort_values("context")
            c = color(d) if d in DESIGNS else KV_LAYOUT_COLORS.get(d, f"C{i}")
            ax.plot(r.context, r.tokens_per_s, "o-", color=c, label=label(d))
            ax.plot(r.context, r.bound_tokens_per_s, "--", color=c, alpha=0.5)
        ax.set(xscale="log", yscale="log", title=f"batch {B}", xlabel="context (tokens)")
        ticks = sorted(kv.context.unique())
        ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short spans
    axes[0][0].set_ylabel("decode tokens/s")
    axes[0][-1].legend(fontsize=7)
    src = kv.iloc[0]
    where = (f"Measured by `qkvlab bench --only kv` on this CPU ({src.taken}, "
             f"{int(src.threads)} thread{'s' * (int(src.threads) != 1)}), read in place of the "
             f"study's own shorter measurement{_kv_agreement_text(data)}"
             if src.source == "bench" else "One interleaved measurement by the study")
    kernels = sorted(set(kv.kernel))
    return save(fig, kv, out, "q3_kv_payoff", "Where K = V pays, and by how much",
                "One decode step of a one-layer decoder (d_model 512, 8 heads of 64) whose cache "
                "holds `context` tokens, per cache layout (gqa_G: G kv heads); dashed: the "
                f"memory bound, batch × copy bandwidth / (cache + weight bytes). {where}. Each "
                "layout's decode attention is the kernel its probe measured faster on the "
                "layer's shapes, SDPA or qkvlab's own (`blocked`: on the CPU in float32 a "
                "Numba kernel that walks each cache row once, a K=V row serving as key and "
                f"value), named per point in the table's kernel column (here "
                f"{' and '.join(kernels)}).")


def _kv_agreement_text(data: StudyData) -> str:
    """The payoff caption's check that the bench it draws agrees with the study's own
    measurement (``compute.payoff.kv_agreement``), or "" where they share no point."""
    agree = kv_agreement(data)
    if agree.empty:
        return ""
    worst = agree.loc[agree.rel.abs().idxmax()]
    return (f"; where both measured ({len(agree)} layout points besides standard), the study's "
            f"own ratios to standard are within {KV_AGREE:.0%} of the bench's at "
            f"{int(agree.within.sum())} (largest difference {worst.rel:+.0%}: "
            f"{worst.design} at {int(worst.context):,} × {int(worst.batch)})")
