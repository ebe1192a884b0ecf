"""Write the report's blocks (``render.build``) as one self-contained HTML page.

No script, font or stylesheet from the network: the CSS is inline and the figures are files
in ``figures/`` next to ``index.html``, so the folder opens from disk anywhere.
"""

from __future__ import annotations

from html import escape

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:0 auto;
padding:1rem 1.5rem;color:#1a1a1a}
h1{font-size:1.5rem}h2{border-bottom:2px solid #ddd;padding-top:1rem}h3{font-size:1.05rem;margin-bottom:.3rem}
nav a{margin-right:1rem}
table{border-collapse:collapse;font-size:12.5px;margin:.5rem 0 1.2rem;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f4f4f4}
caption{caption-side:top;text-align:left;font-style:italic;padding:.2rem 0;color:#444}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:13px;color:#444}
.verdict{background:#f3f8ff;border-left:4px solid #0072B2;padding:.6rem 1rem;margin:.8rem 0}
.verdict p{margin:.3rem 0}.claims li{margin:.2rem 0}.claims q{font-style:italic}
.muted{color:#666;font-size:13px}.note{color:#8a5300;font-size:13px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;font-size:13px}dt{font-weight:600}
"""


def _table(caption: str, headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    if not rows:
        body = f'<tr><td colspan="{len(headers)}">no finished runs</td></tr>'
    return f"<table><caption>{escape(caption)}</caption><tr>{head}</tr>{body}</table>"


def render(blocks: list[tuple]) -> str:
    """The HTML page of ``blocks``."""
    parts, title, sections = [], "qkvlab study", []
    for b in blocks:
        kind = b[0]
        if kind == "title":
            title = b[1]
            parts.append(f"<h1>{escape(b[1])}</h1><nav id=\"toc\"></nav>")
        elif kind == "h2":
            if sections:
                parts.append("</section>")
            sections.append((b[1], b[2]))
            parts.append(f'<section id="{escape(b[1])}"><h2>{escape(b[2])}</h2>')
        elif kind == "h3":
            parts.append(f"<h3>{escape(b[1])}</h3>")
        elif kind == "p":
            parts.append(f"<p>{escape(b[1])}</p>")
        elif kind == "note":
            parts.append(f'<p class="note">Note: {escape(b[1])}</p>')
        elif kind == "verdict":
            v = b[1]
            det = "".join(f"<p>{escape(d)}</p>" for d in v["details"])
            parts.append(f'<div class="verdict"><p><strong>Verdict.</strong> '
                         f'{escape(v["headline"])}</p>{det}</div>')
        elif kind == "claims":
            items = "".join(
                f'<li><q>{escape(c["quote"])}</q> <span class="muted">— {escape(c["thread"])}'
                f'{"" if c["verified"] else " [shipped copy]"}</span><br>tested by: '
                f'{escape(c["tested_by"])}</li>' for c in b[1])
            parts.append(f'<ul class="claims">{items}</ul>')
        elif kind == "figure":
            f = b[1]
            parts.append(
                f'<figure id="fig-{escape(f.name)}"><img src="figures/{escape(f.png)}" '
                f'alt="{escape(f.title)}" width="100%"><figcaption><strong>{escape(f.title)}.'
                f'</strong> {escape(f.caption)} <a href="figures/{escape(f.svg)}">SVG</a> · '
                f'<a href="figures/{escape(f.csv)}">data (CSV)</a></figcaption></figure>')
        elif kind == "table":
            parts.append(_table(b[1], b[2], b[3]))
        elif kind == "meta":
            parts.append("<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>"
                                          for k, v in b[1]) + "</dl>")
        else:
            raise ValueError(f"block: unknown kind {kind!r}")
    if sections:
        parts.append("</section>")
    toc = "".join(f'<a href="#{escape(i)}">{escape(t.split(":")[0])}</a>' for i, t in sections)
    page = "\n".join(parts).replace('<nav id="toc"></nav>', f'<nav id="toc">{toc}</nav>', 1)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><link rel=\"icon\" href=\"data:,\">"
            f"<style>{CSS}</style></head><body>\n{page}\n</body></html>\n")
