"""Write the report's blocks (``render.build``) as Markdown, the twin of ``index.html``."""

from __future__ import annotations


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(caption: str, headers: list[str], rows: list[list[str]]) -> str:
    lines = [f"*{caption}*", "", "| " + " | ".join(map(_cell, headers)) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(_cell, r)) + " |" for r in rows] or ["| no finished runs |"]
    return "\n".join(lines)


def render(blocks: list[tuple]) -> str:
    """The Markdown text of ``blocks``."""
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "title":
            out.append(f"# {b[1]}")
        elif kind == "h2":
            out.append(f"## {b[2]}")
        elif kind == "h3":
            out.append(f"### {b[1]}")
        elif kind == "p":
            out.append(b[1])
        elif kind == "note":
            out.append(f"> Note: {b[1]}")
        elif kind == "verdict":
            v = b[1]
            out.append(f"**Verdict.** {v['headline']}\n\n" + "\n\n".join(v["details"]))
        elif kind == "claims":
            out.append("\n".join(
                f"- “{c['quote']}” — {c['thread']}{'' if c['verified'] else ' [shipped copy]'}; "
                f"tested by: {c['tested_by']}" for c in b[1]))
        elif kind == "figure":
            f = b[1]
            out.append(f"![{f.title}](figures/{f.png})\n\n*{f.title}.* {f.caption} "
                       f"([SVG](figures/{f.svg}), [data](figures/{f.csv}))")
        elif kind == "table":
            out.append(_table(b[1], b[2], b[3]))
        elif kind == "meta":
            out.append("\n".join(f"- **{k}**: {v}" for k, v in b[1]))
        else:
            raise ValueError(f"block: unknown kind {kind!r}")
    return "\n\n".join(out) + "\n"
