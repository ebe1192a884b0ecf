"""Markdown tables: the one renderer the command lines, the bench, the zoo page, the report and
the scripts share.

``markdown_table(headers, rows)`` writes a header row, the ``---`` rule and one row per item;
every cell goes through ``cell`` (by default :func:`number`: floats to 3 significant digits
below 0.01 or from 1e5, else 2 decimals, ints with thousands separators, anything else as its
``str``), then a ``|`` in it is escaped and a newline flattened, so no cell breaks its row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["markdown_table", "number"]


def number(v) -> str:
    """A cell's text: floats to 3 significant digits below 0.01 or from 1e5, else 2 decimals,
    ints with thousands separators, anything else as ``str``."""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e5 else f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _safe(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence, rows: Iterable[Sequence],
                   cell: Callable[[object], str] = number, empty: str | None = None) -> str:
    """A Markdown table of ``rows`` under ``headers`` (see the module docstring); with no rows
    and ``empty`` given, one row saying ``empty``."""
    lines = ["| " + " | ".join(_safe(str(h)) for h in headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_safe(cell(v)) for v in r) + " |" for r in rows]
    if len(lines) == 2 and empty is not None:
        lines.append(f"| {_safe(empty)} |")
    return "\n".join(lines)
