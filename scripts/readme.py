"""Regenerate the README's answers table from written reports:
`python scripts/readme.py [REPORT ...]` (default: every `reports/*/` holding a `verdicts.json`).

One row per question and report: the question, the report's profile and date, and its answer
card (``answers.json``, which ``qkvlab study`` writes: the plain sentence, then the numbers that
carry it, decided after Holm's correction and the control's gate, or deterministic). What lies
between the README's two ``answers`` markers is replaced; nothing else is touched, and no number
is typed: every figure in the table is the report's.
"""

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.tables import markdown_table

BEGIN, END = "<!-- answers: begin -->", "<!-- answers: end -->"


def rows(report: Path) -> list[tuple[str, str, str]]:
    """(question title, "profile, date", the card's sentence and numbers) per question."""
    path = report / "answers.json"
    if not path.is_file():
        sys.exit(f"{report}: no answers.json (a folder `qkvlab study` wrote, e.g. reports/quick)")
    cards = json.loads(path.read_text())
    when = dt.date.fromtimestamp(path.stat().st_mtime).isoformat()
    out = []
    for q in QUESTIONS:
        if q in cards:
            c = cards[q]
            nums = "<br>".join(f"{k}: {v}" for k, v in c["numbers"])
            out.append((QUESTIONS[q].title, f"`{c['profile']}`, {when}",
                        f"**{c['sentence']}** {c.get('more', '')}<br>{nums}"))
    return out


def table(reports: list[Path]) -> str:
    found = [r for rep in reports for r in rows(rep)]
    order = {q.title: i for i, q in enumerate(QUESTIONS.values())}
    found.sort(key=lambda r: order[r[0]])  # by question, reports in the order given
    return markdown_table(["question", "report", "the answer, and the numbers that carry it"],
                          found, cell=str)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="*", type=Path)
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    args = p.parse_args()
    reports = args.reports or sorted(d for d in Path("reports").glob("*")
                                     if (d / "answers.json").is_file())
    if not reports:
        sys.exit("no report given and none in reports/ (run `make report` first)")
    text = args.readme.read_text()
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        sys.exit(f"{args.readme}: no '{BEGIN}' ... '{END}' markers")
    args.readme.write_text(f"{head}{BEGIN}\n{table(reports)}\n{END}{tail}")
    print(f"wrote {args.readme}: {len(reports)} report(s)")


if __name__ == "__main__":
    main()
