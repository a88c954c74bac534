"""The README's figures are the pages' figures: every number of a row's "recorded" cell is, as the README rounds it,
a number of the section the row cites (the part of the page under that heading), or of a page the cell itself
links to. A figure copied by hand and left behind when ``make bench`` rewrote the page fails here."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
LINK = re.compile(r"\[[^\]]*\]\(([^)]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")


def _section(text: str, anchor: str) -> str:
    """The lines under the heading whose anchor is ``anchor``, up to the next heading of its level or above."""
    if not anchor:
        return text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"(#+) (.*)", line)
        if heading and _slug(heading.group(2)) == anchor:
            level, out = len(heading.group(1)), []
            for later in lines[i + 1 :]:
                if (deeper := re.match(r"(#+) ", later)) and len(deeper.group(1)) <= level:
                    break
                out.append(later)
            return "\n".join(out)
    raise AssertionError(f"no heading with the anchor #{anchor}")


def _numbers(text: str) -> list[Decimal]:
    return [Decimal(n.replace(",", "")) for n in NUMBER.findall(text)]


def _shown_as(value: Decimal, figure: Decimal) -> bool:
    """``value`` rounded to ``figure``'s decimal places is ``figure`` (half up or half even)."""
    step = Decimal(1).scaleb(figure.as_tuple().exponent)  # type: ignore[arg-type]
    return any(value.quantize(step, rounding=r) == figure for r in (ROUND_HALF_UP, ROUND_HALF_EVEN))


def _rows() -> list[list[str]]:
    table = (ROOT / "README.md").read_text().split("## Figures", 1)[1].split("\n## ", 1)[0]
    lines = [
        line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| figure", "| ---"))
    ]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _missing(recorded: str, cited: str) -> list[str]:
    """The numbers of ``recorded`` that the cited section, and the pages ``recorded`` links to, do not hold."""
    path, _, anchor = LINK.search(cited).group(1).partition("#")  # type: ignore[union-attr]
    sources = _numbers(_section((ROOT / path).read_text(), anchor))
    for link in LINK.findall(recorded):
        sources += _numbers((ROOT / link.partition("#")[0]).read_text())
    return [str(f) for f in _numbers(LINK.sub("", recorded)) if not any(_shown_as(v, f) for v in sources)]


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row[0][:60])
def test_every_readme_figure_is_its_page_s(row):
    figure, _goal, recorded, page = row
    assert not _missing(recorded, page), f"README figure {figure!r}: {_missing(recorded, page)} are not on {page}"


def test_a_figure_the_page_does_not_hold_is_caught():
    cited = "[benchmarks](docs/benchmarks.md#goals)"
    light = next(row for row in _rows() if row[0].startswith("light `/predict`"))
    assert not _missing(light[2], cited)
    assert _missing("3.4x", cited) == ["3.4"], "the README's figure before the page was rewritten"
    assert _missing("8,824 labels/s", "[alarm benchmark](docs/alarm_benchmark.md#goals)") == ["8824"]
