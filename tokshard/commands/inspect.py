"""``tokshard inspect MANIFEST...``: its options and output (``pipeline.inspection`` reads the
shards, ``tokshard.inspection_plot`` draws ``--plot``)."""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.format.errors import TokshardError
from pipeline.storage.locations import refuse_url
from tokshard.commands.command import Command, each_path
from tokshard.usage import add_data_cache_options, path_arg, png_arg


def add_options(p: argparse.ArgumentParser) -> None:
    from tokshard.inspection_plot import PLOT_FILE

    p.add_argument(
        "manifest",
        nargs="+",
        type=path_arg,
        help="manifest.json or its folder; several (runs/*/, as the shell expands it) are each inspected",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (for several manifests, a list in their order)",
    )
    p.add_argument(
        "--plot", action="store_true", help="also draw a histogram of document lengths per source (PNG)"
    )
    p.add_argument(
        "--plot-file",
        metavar="PNG",
        type=png_arg,
        help=f"where --plot writes (default: {PLOT_FILE} beside the manifest); implies --plot",
    )
    add_data_cache_options(p)


def check_plot_file(manifest: str, plot_file: str | None) -> None:
    """Refuse, before any work, a plot with nowhere to go: a stored manifest has no folder on
    this machine to hold the default PNG beside it."""
    from pipeline.storage.places import open_manifest_place

    refuse_url(plot_file, "--plot-file")
    stored = open_manifest_place(manifest)[0].local_root is None
    if stored and not plot_file:
        raise TokshardError("--plot of a manifest URL needs --plot-file PNG (a local file to write)")


def run(args: argparse.Namespace) -> int:
    plot = args.plot or args.plot_file
    if plot and args.plot_file and len(args.manifest) > 1:
        raise TokshardError(
            "--plot-file names one PNG: give one manifest, or --plot alone (a PNG beside each)"
        )
    if plot:
        for manifest in args.manifest:
            check_plot_file(manifest, args.plot_file)
    cache = (args.data_cache, args.data_cache_limit)
    reports, code = each_path(
        args.manifest, lambda m: _inspect_one(m, args.json, args.plot_file, plot, cache)
    )
    if args.json:
        print(json.dumps(reports if len(args.manifest) > 1 else reports[0], indent=1))
    return code


def _inspect_one(
    manifest: str, as_json: bool, plot_file: str | None, plot: bool, cache: tuple[str | None, str | None]
) -> dict:
    """One manifest's report (printed here unless it goes out as JSON), and its plot; ``cache``:
    --data-cache and --data-cache-limit, for a manifest URL."""
    from pipeline.inspection import render, summary

    report = summary(manifest, cache=cache)
    if not as_json:
        print(render(report))
    if plot:
        from tokshard.inspection_plot import plot_doc_lengths

        png = plot_doc_lengths(manifest, plot_file, cache)
        print(f"wrote {png}", file=sys.stderr if as_json else sys.stdout)
    return report


COMMAND = Command(
    name="inspect",
    summary="counts per source and split, document-length stats, a decoded sample",
    example="tokshard inspect data/wt103",
    add_options=add_options,
    run=run,
)
