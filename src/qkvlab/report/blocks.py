"""A report as a list of typed blocks, written as one self-contained HTML page and as Markdown.

Each block is a small frozen dataclass that renders itself both ways (``html()``,
``markdown()``), so the two outputs cannot drift apart and a new kind of block is one class.
No script, font or stylesheet comes from the network: the CSS is inline and figures are files
in ``figures/`` next to ``index.html``, so the folder opens from disk anywhere.

    page = [Title("..."), Section("summary", "Summary"), Para("..."), Table(...), Figure(...)]
    write_page(page, folder)   # folder/index.html and folder/report.md
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from qkvlab.fileio import atomic_write_text
from qkvlab.tables import markdown_table

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:0 auto;
padding:1rem 1.5rem;color:#1a1a1a}
h1{font-size:1.5rem}h2{border-bottom:2px solid #ddd;padding-top:1rem}\
h3{font-size:1.05rem;margin-bottom:.3rem}
nav a{margin-right:1rem}
table{border-collapse:collapse;font-size:12.5px;margin:.5rem 0 1.2rem;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}\
th{background:#f4f4f4}
caption{caption-side:top;text-align:left;font-style:italic;padding:.2rem 0;color:#444}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:13px;color:#444}
.verdict{background:#f3f8ff;border-left:4px solid #0072B2;padding:.6rem 1rem;margin:.8rem 0}
.verdict p{margin:.3rem 0}.quotes li{margin:.2rem 0}.quotes q{font-style:italic}
.muted{color:#666;font-size:13px}.note{color:#8a5300;font-size:13px}
.worse{color:#b00020;font-weight:600}.better{color:#00703c;font-weight:600}
.card{display:grid;grid-template-columns:1fr 320px;gap:1rem;border:1px solid #d0d7de;\
border-radius:6px;padding:.4rem 1rem;margin:.8rem 0;background:#fafbfc}
.card h3{margin:.4rem 0 .2rem}.card .answer{font-size:16px;font-weight:600;margin:.3rem 0}\
.card ul{margin:.2rem 0;padding-left:1.2rem;font-size:13.5px}.card img{width:100%;align-self:center}
@media (max-width:700px){.card{grid-template-columns:1fr}}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;font-size:13px}\
dt{font-weight:600}
"""


@dataclass(frozen=True)
class Title:
    text: str

    def html(self) -> str:
        return f'<h1>{escape(self.text)}</h1><nav id="toc"></nav>'

    def markdown(self) -> str:
        return f"# {self.text}"


@dataclass(frozen=True)
class Section:
    """A level-2 heading that opens a section (``id`` is its anchor, listed in the page's nav)."""

    id: str
    text: str

    def html(self) -> str:
        return f'<section id="{escape(self.id)}"><h2>{escape(self.text)}</h2>'

    def markdown(self) -> str:
        return f"## {self.text}"


@dataclass(frozen=True)
class Heading:
    text: str

    def html(self) -> str:
        return f"<h3>{escape(self.text)}</h3>"

    def markdown(self) -> str:
        return f"### {self.text}"


@dataclass(frozen=True)
class Para:
    text: str
    note: bool = False  # a warning-coloured note (a measure that could not run, ...)

    def html(self) -> str:
        if self.note:
            return f'<p class="note">Note: {escape(self.text)}</p>'
        return f"<p>{escape(self.text)}</p>"

    def markdown(self) -> str:
        return f"> Note: {self.text}" if self.note else self.text


@dataclass(frozen=True)
class Quote:
    quote: str
    source: str
    note: str = ""  # e.g. what tests the claim


@dataclass(frozen=True)
class Quotes:
    items: tuple[Quote, ...]

    def html(self) -> str:
        li = "".join(f'<li><q>{escape(q.quote)}</q> <span class="muted">— {escape(q.source)}'
                     f'</span>{"<br>" + escape(q.note) if q.note else ""}</li>' for q in self.items)
        return f'<ul class="quotes">{li}</ul>'

    def markdown(self) -> str:
        return "\n".join(f"- “{q.quote}” — {q.source}{'; ' + q.note if q.note else ''}"
                         for q in self.items)


@dataclass(frozen=True)
class Verdict:
    headline: str
    details: tuple[str, ...] = ()

    def html(self) -> str:
        det = "".join(f"<p>{escape(d)}</p>" for d in self.details)
        return (f'<div class="verdict"><p><strong>Verdict.</strong> {escape(self.headline)}</p>'
                f"{det}</div>")

    def markdown(self) -> str:
        return "\n\n".join([f"**Verdict.** {self.headline}", *self.details])


@dataclass(frozen=True)
class Table:
    """Rows of text cells under ``headers``; ``legend`` is a line under the table."""

    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    legend: str = ""
    empty: str = "no finished runs"

    def html(self) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        if not self.rows:
            body = f'<tr><td colspan="{len(self.headers)}">{escape(self.empty)}</td></tr>'
        leg = f'<p class="muted">{escape(self.legend)}</p>' if self.legend else ""
        return (f"<table><caption>{escape(self.caption)}</caption><tr>{head}</tr>{body}</table>"
                f"{leg}")

    def markdown(self) -> str:
        lines = [f"*{self.caption}*", "", markdown_table(self.headers, self.rows, cell=str,
                                                         empty=self.empty)]
        if self.legend:
            lines += ["", self.legend]
        return "\n".join(lines)


@dataclass(frozen=True)
class Figure:
    """A figure drawn into ``figures/``: PNG for the page, SVG and the CSV of what is drawn."""

    name: str
    title: str
    caption: str
    png: str
    svg: str
    csv: str

    def html(self) -> str:
        return (f'<figure id="fig-{escape(self.name)}"><img src="figures/{escape(self.png)}" '
                f'alt="{escape(self.title)}" width="100%"><figcaption><strong>'
                f'{escape(self.title)}.</strong> {escape(self.caption)} <a href="figures/'
                f'{escape(self.svg)}">SVG</a> · <a href="figures/{escape(self.csv)}">data (CSV)'
                f"</a></figcaption></figure>")

    def markdown(self) -> str:
        return (f"![{self.title}](figures/{self.png})\n\n*{self.title}.* {self.caption} "
                f"([SVG](figures/{self.svg}), [data](figures/{self.csv}))")


@dataclass(frozen=True)
class Card:
    """An answer at a glance: the question, one plain sentence, the numbers that carry it
    (label, value with CI, unit and scale), one figure, and what is open with what would
    settle it."""

    id: str
    question: str
    sentence: str
    numbers: tuple[tuple[str, str], ...] = ()
    figure: Figure | None = None
    open: str = ""
    more: str = ""  # a second sentence, not bold: what qualifies the first

    def html(self) -> str:
        more = f"<p>{escape(self.more)}</p>" if self.more else ""
        nums = "".join(f"<li>{escape(k)}: <strong>{escape(v)}</strong></li>"
                       for k, v in self.numbers)
        fig = (f'<a href="#fig-{escape(self.figure.name)}"><img src="figures/'
               f'{escape(self.figure.png)}" alt="{escape(self.figure.title)}"></a>'
               if self.figure else "")
        opened = f'<p class="muted">Open: {escape(self.open)}</p>' if self.open else ""
        return (f'<div class="card" id="card-{escape(self.id)}"><div><h3>'
                f'{escape(self.question)}</h3><p class="answer">{escape(self.sentence)}</p>'
                f'{more}<ul>{nums}</ul>{opened}</div>{fig}</div>')

    def markdown(self) -> str:
        lines = [f"### {self.question}", "", f"**{self.sentence}**"]
        if self.more:
            lines += ["", self.more]
        if self.numbers:
            lines += [""] + [f"- {k}: **{v}**" for k, v in self.numbers]
        if self.figure:
            lines += ["", f"![{self.figure.title}](figures/{self.figure.png})"]
        if self.open:
            lines += ["", f"Open: {self.open}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Meta:
    """Key-value facts (profile, hardware, versions, ...)."""

    items: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def html(self) -> str:
        return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>"
                                for k, v in self.items) + "</dl>"

    def markdown(self) -> str:
        return "\n".join(f"- **{k}**: {v}" for k, v in self.items)


Block = Title | Section | Heading | Para | Quotes | Verdict | Table | Figure | Card | Meta


def sections(blocks: list[Block]) -> list[Section]:
    return [b for b in blocks if isinstance(b, Section)]


def render_html(blocks: list[Block]) -> str:
    """The HTML page of ``blocks``: sections close where the next one opens."""
    parts, title, opened = [], "report", False
    for b in blocks:
        if isinstance(b, Title):
            title = b.text
        if isinstance(b, Section):
            if opened:
                parts.append("</section>")
            opened = True
        parts.append(b.html())
    if opened:
        parts.append("</section>")
    toc = "".join(f'<a href="#{escape(s.id)}">{escape(s.text.split(":")[0])}</a>'
                  for s in sections(blocks))
    page = "\n".join(parts).replace('<nav id="toc"></nav>', f'<nav id="toc">{toc}</nav>', 1)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{escape(title)}</title><link rel="icon" href="data:,">'
            f"<style>{CSS}</style></head><body>\n{page}\n</body></html>\n")


def render_markdown(blocks: list[Block]) -> str:
    return "\n\n".join(b.markdown() for b in blocks) + "\n"


def write_page(blocks: list[Block], folder: str | Path) -> Path:
    """``folder/index.html`` and ``folder/report.md``, each written atomically; returns the
    path of ``index.html``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "index.html", render_html(blocks))
    atomic_write_text(folder / "report.md", render_markdown(blocks))
    return folder / "index.html"
