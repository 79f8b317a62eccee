"""`tokshard inspect --plot`: a histogram of document lengths in tokens, one panel per source.

Lengths come from the shards' .idx files alone (``inspection.doc_lengths``), so plotting a
100 GB dataset reads a few MB. Bins are logarithmic: corpora mix one-line documents with
books, and a linear axis would hide one end or the other. Each split is its own outline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.inspection import doc_lengths
from pipeline.storage.data_cache import load_manifest
from trainer.figures import figure, save_png

PLOT_FILE = "doc_lengths.png"
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]


def plot_doc_lengths(
    manifest_path: str | Path,
    png: str | Path | None = None,
    cache: tuple[str | None, str | None] = (None, None),
) -> Path:
    """Draw the histogram into ``png`` (default: ``doc_lengths.png`` beside the manifest); a
    manifest URL's files go through the data cache ``cache`` names (folder, size limit)."""
    m = load_manifest(manifest_path, *cache)
    out = Path(png) if png is not None else m.path.parent / PLOT_FILE
    sources = m.sources()
    fig = figure(8, 2.6 * max(1, len(sources)))
    axes = np.atleast_1d(fig.subplots(max(1, len(sources)), 1, squeeze=False)[:, 0])
    for ax, source in zip(axes, sources, strict=False):
        splits = {split: doc_lengths(m, source, split) for split in m.splits(source)}
        nonempty = [v for v in splits.values() if len(v)]
        low = max(1, min((int(v.min()) for v in nonempty), default=1))
        high = max((int(v.max()) for v in nonempty), default=1)
        bins = np.unique(np.geomspace(low, max(high, low + 1) + 1, 40).astype(int))
        for i, (split, lengths) in enumerate(splits.items()):
            if not len(lengths):
                continue
            color = COLORS[i % len(COLORS)]
            median = float(np.median(lengths))
            ax.hist(
                np.maximum(lengths, 1),
                bins=bins,
                histtype="step",
                lw=1.5,
                color=color,
                label=f"{split}: {len(lengths):,} docs, median {median:,.0f}",
            )
            ax.axvline(median, color=color, ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_title(f"{source} ({m.data['sources'][source]['type']})", loc="left")
        ax.set_ylabel("documents")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small", framealpha=0.9)
    axes[-1].set_xlabel("document length (tokens, EOS excluded)")
    fig.suptitle(f"document lengths: {m.path}")
    return save_png(fig, out, "pass --plot-file PATH")
