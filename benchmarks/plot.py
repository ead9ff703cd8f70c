"""``--plot OUT.png``: the accepted-length histogram and the per-position acceptance curve, one series each.

matplotlib is imported here only, when a plot is asked for (``pip install 'openinfer[bench]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from openinfer.tools.spec_tally import AcceptanceTally


@dataclass(frozen=True)
class PlotSeries:
    """One line on both panels: a run, or a drafter on a dataset summed over a sweep's concurrencies."""

    label: str
    tally: AcceptanceTally
    has_histogram: bool  # False: the server exports no accepted-length histogram (vLLM); left panel skips it


def plot_acceptance(series: list[PlotSeries], out: Path, title: str) -> None:
    """Write a PNG: left, the share of rounds by accepted draft tokens (0..K); right, per-position rates."""
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install 'openinfer[bench]'") from e
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (hist_axes, pos_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for one in series:
        drafts = one.tally.num_drafts
        if drafts == 0:
            continue
        if one.has_histogram:
            hist = one.tally.hist
            hist_axes.plot(range(len(hist)), [n / drafts for n in hist], marker="o", label=one.label)
        rates = one.tally.per_pos_rates()
        pos_axes.plot(range(len(rates)), rates, marker="o", label=one.label)
    hist_axes.set(title="accepted-length histogram", xlabel="draft tokens accepted in a round")
    hist_axes.set(ylabel="share of rounds")
    pos_axes.set(
        title="per-position acceptance",
        xlabel="draft position (0: first)",
        ylabel="share of rounds accepting it",
    )
    for axes in (hist_axes, pos_axes):
        axes.set_ylim(bottom=0)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "no drafts", ha="center", va="center", transform=axes.transAxes)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
