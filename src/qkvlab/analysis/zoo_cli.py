"""``qkvlab zoo`` (list the zoo, what is fetched and where) and ``qkvlab zoo fetch NAME|all``."""

from __future__ import annotations

import argparse
import sys

from qkvlab.analysis.zoo import ZooError, fetch, get, load_manifest, rows, zoo_dir


def configure_zoo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["list", "fetch", "table"], default="list",
                        help="list (default): every model, its size and where it is; fetch: "
                             "download, rebuild and verify NAME (or all); table: the README's "
                             "Markdown table")
    parser.add_argument("names", nargs="*", metavar="NAME", help="zoo names, or 'all' (fetch)")
    parser.add_argument("--dir", default=None,
                        help="zoo folder (default: $QKVLAB_ZOO, else ~/.cache/qkvlab/zoo)")
    parser.add_argument("--keep-wheels", action="store_true",
                        help="keep the downloaded wheels in <dir>/.wheels")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run_zoo(args) -> int:
    models = load_manifest()
    if args.action == "table":
        from qkvlab.analysis.zoo import markdown_table

        print(markdown_table(models))
        return 0
    if args.action == "list":
        print(f"zoo folder: {zoo_dir(args.dir)} (set --dir or ${'QKVLAB_ZOO'})")
        print("| name | model | family | roles | params | size | profile | where |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows(models, args.dir):
            print(f"| {r['name']} | {r['model']} | {r['family']} | {r['roles']} | "
                  f"{r['params'] / 1e6:,.0f}M | {r['size'] / 1e6:,.0f} MB | {r['profile']} | "
                  f"{r['where']} |")
        return 0
    if not args.names:
        print(f"error: zoo fetch: name a model or 'all'; known: {sorted(models)}",
              file=sys.stderr)
        return 2
    names = list(models) if args.names == ["all"] else args.names
    try:
        todo = [get(n, models) for n in names]
        for m in todo:
            root = fetch(m, args.dir, progress=not args.quiet, keep_wheels=args.keep_wheels)
            print(f"{m.name}: {len(m.files)} files verified in {root}")
    except ZooError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
