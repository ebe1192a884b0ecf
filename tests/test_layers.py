"""Imports flow down the layers of DEVELOPERS.md, and every package and module has a layer.

``LAYERS`` ranks every top-level entry of ``src/qkvlab``, lowest first; a file may import its
own entry or a lower-ranked one, never a higher one. The leaves (``LEAVES``) import nothing
from qkvlab but other leaves, so every layer may use them. A new top-level package or module
fails ``test_every_entry_has_a_layer`` until it is placed here. The library never imports a
study (``qkvlab`` finds installed studies through the ``qkvlab.studies`` entry points), and the
three questions' study is itself three layers, plan, compute and render (``STUDY_LAYERS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "qkvlab"
LEAVES = ("typed", "fileio", "env", "progress", "stats", "timing", "inputs", "cliargs", "tables")
# lowest first: kernels under the attention designs that use them, the bench above every
# library layer it times, the studies above the library, the command line and the package's
# own namespace on top
LAYERS = (*LEAVES, "kernels", "attention", "models", "data", "train", "experiments",
          "analysis", "hf", "report", "bench", "studies", "cli", "__init__")
STUDY = SRC / "studies" / "qkv"
# the study's own layers: what is planned, what is computed from the store, what is rendered;
# study.py (which runs it all), cli.py and __init__.py sit on top
STUDY_LAYERS = ("plan", "compute", "render", "study", "cli", "__init__")


def entries(folder: Path) -> set[str]:
    """Top-level packages and modules of a folder (``x.py`` -> ``x``)."""
    return {p.name.removesuffix(".py") for p in folder.iterdir()
            if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"}


def imports(path: Path, prefix: str) -> set[str]:
    """The component after ``prefix`` of every absolute import of ``prefix.X`` in a file, at
    any depth (lazy imports inside functions count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        depth = prefix.count(".") + 1
        out |= {n.split(".")[depth] for n in names
                if n.startswith(prefix + ".") and n.count(".") >= depth}
    return out


def files_of(folder: Path, entry: str) -> list[Path]:
    return sorted((folder / entry).rglob("*.py")) if (folder / entry).is_dir() \
        else [folder / f"{entry}.py"]


def upward(folder: Path, prefix: str, order: tuple[str, ...]) -> set[str]:
    """``file imports prefix.X`` for every import of an entry ranked above the file's own."""
    bad = set()
    for entry in order:
        above = set(order[order.index(entry) + 1:])
        for path in files_of(folder, entry):
            bad |= {f"{path.relative_to(SRC)} imports {prefix}.{m}"
                    for m in imports(path, prefix) & above}
    return bad


@pytest.mark.parametrize(("folder", "order"), [(SRC, LAYERS), (STUDY, STUDY_LAYERS)],
                         ids=["qkvlab", "studies.qkv"])
def test_every_entry_has_a_layer(folder, order):
    assert entries(folder) == set(order)


def test_imports_flow_down_the_layers():
    assert upward(SRC, "qkvlab", LAYERS) == set()


def test_leaves_import_only_leaves():
    bad = {f"{leaf} imports qkvlab.{m}" for leaf in LEAVES for p in files_of(SRC, leaf)
           for m in imports(p, "qkvlab") - set(LEAVES)}
    assert bad == set()


def test_the_study_flows_from_plan_to_compute_to_render():
    assert upward(STUDY, "qkvlab.studies.qkv", STUDY_LAYERS) == set()


def test_nothing_outside_the_studies_imports_a_study():
    bad = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
           if "studies" in imports(p, "qkvlab") and p.relative_to(SRC).parts[0] != "studies"}
    assert bad == set()


def test_the_study_does_not_import_the_bench():
    bad = {str(p.relative_to(SRC)) for p in (SRC / "studies").rglob("*.py")
           if "bench" in imports(p, "qkvlab")}
    assert bad == set()


MAX_LINES = 400  # one file, one job: a module past this is split by what it does


def test_no_source_file_is_over_the_line_limit():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_render_decides_nothing():
    """Render words findings; it runs no statistics of its own: no ``qkvlab.stats``, scipy or
    statsmodels import anywhere under render/ (a decision is a finding made in compute)."""
    bad = set()
    for p in (STUDY / "render").rglob("*.py"):
        if "stats" in imports(p, "qkvlab"):
            bad.add(f"{p.relative_to(SRC)} imports qkvlab.stats")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad |= {f"{p.relative_to(SRC)} imports {n}" for n in names
                    if n.split(".")[0] in ("scipy", "statsmodels")}
    assert bad == set()


def test_the_plan_has_no_import_circle():
    """Profiles are sizes: they import nothing of how rates are read back (``Rates`` is filled
    by the preparer ``plan.experiments`` registers), so no plan module imports one that imports
    it back. Every import counts: lazy ones and those under ``TYPE_CHECKING`` too."""
    import graphlib

    plan = STUDY / "plan"
    graph = {p.stem: imports(p, "qkvlab.studies.qkv.plan") - {p.stem}
             for p in plan.glob("*.py") if p.stem != "__init__"}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle
    assert "rates" not in graph["profiles"] and "scaling" not in graph["profiles"]
