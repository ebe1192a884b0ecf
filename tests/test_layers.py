"""Imports flow down the layers of DEVELOPERS.md: kernels, attention, models, data, train,
experiments, analysis, report, the studies, then cli. The library never imports a study: ``qkvlab`` finds
installed studies through the ``qkvlab.studies`` entry points. A module may import its own layer or a lower one, never a higher
one (``fold_alt`` rewrites model configs, so it lives in ``models``, not ``attention``).
``bench`` sits above models: it times them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ORDER = ("kernels", "attention", "models", "bench", "data", "train", "experiments", "analysis",
         "report", "studies", "cli")
LAYERS = [m for m in ORDER if m not in ("bench", "cli")]  # the folders
SRC = Path(__file__).resolve().parents[1] / "src" / "qkvlab"


def qkvlab_imports(path: Path) -> set[str]:
    """Second components of every ``qkvlab.X`` imported by a file, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        out |= {n.split(".")[1] for n in names if n.startswith("qkvlab.")}
    return out


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_flow_down_the_layers(layer):
    above = set(ORDER[ORDER.index(layer) + 1:])
    bad = {f"{p.relative_to(SRC)} imports qkvlab.{m}"
           for p in (SRC / layer).rglob("*.py") for m in qkvlab_imports(p) & above}
    assert bad == set()


def test_nothing_outside_the_studies_imports_a_study():
    bad = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
           if "studies" in qkvlab_imports(p) and p.relative_to(SRC).parts[0] != "studies"}
    assert bad == set()
