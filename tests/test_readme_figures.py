"""The README's figures are the pages' figures: every number of a row's "recorded" cell is, as the README rounds it,
a number of the section the row cites (the part of the page under that heading), or of a page the cell itself
links to. A figure copied by hand and left behind when ``make bench`` rewrote the page fails here."""

from __future__ import annotations

import json
import random
import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path
from types import SimpleNamespace

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


# The table is generated (bench/figures.py) by the command that writes the pages.


def _synthetic_serving(seed: int = 0) -> dict:
    """A serving result with every measurement that ``bench.serving.goals.goals`` judges into the README's rows,
    its figures drawn at random so that no row can hold them by chance."""
    from bench.common import HEAVY, LIGHT

    rng = random.Random(seed)
    heavy = {
        f"{side}_vs_raw": {
            f"{side}_vs_raw": rng.uniform(0.3, 0.7),
            f"{side}_rows_per_s": rng.uniform(100, 900),
            f"raw_{side}_rows_per_s": rng.uniform(900, 1800),
            f"{side}_batch": rng.uniform(4, 30),
            "grpc_batching_floor_vs_raw": rng.uniform(0.5, 1),
        }
        for side in ("json", "binary", "grpc")
    }
    light = [
        {"server": server, "model": LIGHT, "rows": 1, "clients": 64, "requests_per_s": rng.uniform(200, 4000)}
        for server in ("service", "baseline")
    ]
    return {
        "providers": {HEAVY: "CPUExecutionProvider", LIGHT: "CPUExecutionProvider"},
        "heavy_rounds": {"clients": 64, "rounds": [0, 1, 2], **heavy},
        "load": light,
        "queue_delay": {"max_queue_delay_ms": 5.0, "clients": 4, "p99_ms": rng.uniform(5, 7)},
        "logging": [],
        "monitoring": {
            "calibration": [{"p99_ms": rng.uniform(1, 90), "window": 1000, "labels_arriving": False}],
            "feedback": {"labels_per_s": rng.uniform(1_000, 20_000)},
        },
        "soak": {"minutes": 1.0, "growth": rng.uniform(-0.1, 0.1)},
    }


@pytest.fixture
def bench_here(tmp_path, monkeypatch):
    """``bench.registry.main`` on a stand-in benchmark whose measure returns ``_synthetic_serving`` and whose goals are
    the serving benchmark's own, every file it writes under ``tmp_path``: results, docs/ and a copy of README.md."""
    from bench import common, figures, registry
    from bench.serving.goals import goals

    here = SimpleNamespace(main=registry.main, readme=tmp_path / "README.md", results=tmp_path / "results")
    here.readme.write_text((ROOT / "README.md").read_text())
    here.page = tmp_path / "docs" / registry.PAGES["serving"]
    here.page.parent.mkdir()
    monkeypatch.setattr(common, "RESULTS", here.results)
    monkeypatch.setattr(registry, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "README", here.readme)
    steps = common.Benchmark(measure=lambda args: _synthetic_serving(), goals=goals, render=lambda result: "")
    monkeypatch.setattr(registry, "module", lambda name: SimpleNamespace(__doc__="stand-in", BENCHMARK=steps))
    return here


def _table(text: str) -> dict[str, list[str]]:
    from bench.figures import current_rows

    return current_rows(text)


def _around_the_table(text: str) -> tuple[str, str]:
    return text.split("| figure", 1)[0], text.split("## Figures", 1)[1].split("\n## ", 1)[1]


def _the_page_s_other_results(here) -> None:
    """Results, here, of the benchmarks that share the serving benchmark's page: none holds a README figure."""
    from bench.registry import PAGES

    here.results.mkdir(exist_ok=True)
    for name in PAGES:
        if PAGES[name] == PAGES["serving"] and name != "serving":
            (here.results / f"{name}.json").write_text(json.dumps({"machine": {"commit": "stand-in"}}))


def test_a_run_writes_its_rows_and_leaves_the_others(bench_here):
    """The serving benchmark's run rewrites the rows that cite its section, with its figures; the rows of the
    benchmarks whose results hold none of their figures stay as the README had them, and so does the text around the
    table."""
    _the_page_s_other_results(bench_here)
    before = bench_here.readme.read_text()
    bench_here.main("serving", [])
    after = bench_here.readme.read_text()
    assert bench_here.page.exists()
    result = json.loads((bench_here.results / "serving.json").read_text())
    measured = [Decimal(repr(g["measured"])) for g in result["goals"]]
    old, new = _table(before), _table(after)
    assert list(old) == list(new), "the same rows, in the same order"
    serving = [figure for figure in old if old[figure][3] == "[benchmarks](docs/benchmarks.md#goals)"]
    assert len(serving) == 3 and all(new[figure] != old[figure] for figure in serving)
    for figure in serving:
        shown = _numbers(new[figure][2])
        assert shown and all(any(_shown_as(v, f) for v in measured) for f in shown), new[figure][2]
    assert all(new[figure] == old[figure] for figure in old if figure not in serving)
    assert _around_the_table(after) == _around_the_table(before)


def test_a_lone_run_keeps_the_sections_of_a_shared_page_and_writes_what_committed_files_give(bench_here, capsys):
    """On a fresh clone (no other results here), a lone run of one benchmark of the shared page writes its result,
    but not a page holding only its section: the page's sections stay, its GPU section is written from the recorded
    runs, and the README's rows from committed files alone, so that none cites a figure the page lacks."""
    from bench.gpu import HEADING, recorded_section

    bench_here.page.write_text(f"the committed sections\n\n{HEADING}\n\nan older recording\n")
    before = bench_here.readme.read_text()
    bench_here.main("serving", [])
    assert (bench_here.results / "serving.json").exists()
    assert bench_here.page.read_text() == "the committed sections\n\n" + recorded_section()
    assert bench_here.readme.read_text() == before  # its GPU, report and study rows are those files' already
    said = capsys.readouterr().out
    assert "sections kept" in said and "feedback_load" in said and "serving," not in said


def test_a_smoke_run_writes_no_page_and_no_readme(bench_here):
    before = bench_here.readme.read_text()
    bench_here.main("serving", ["--smoke"])
    assert (bench_here.results / "serving-smoke.json").exists()
    assert bench_here.readme.read_text() == before
    assert not bench_here.page.exists()


def test_the_rows_of_committed_files_are_generated_from_them():
    """The recorded GPU runs, the default model's metrics and the loss study are committed: their rows are what the
    generator writes from them, so a figure of theirs edited by hand in the README fails here."""
    from bench.figures import BENCH_SOURCES, ROWS, cells, sources

    found, readme = sources(), _table((ROOT / "README.md").read_text())
    committed = [row for row in ROWS if row.source not in BENCH_SOURCES]
    assert {row.source for row in committed} >= {"engine", "engine with replicas", "device", "report", "study"}
    for row in committed:
        assert found[row.source] is not None, row.source
        assert cells(row, found[row.source], readme[row.figure]) == readme[row.figure]
        cell = readme[row.figure][2]
        edited = NUMBER.sub(lambda m: str(Decimal(m.group().replace(",", "")) + 1), cell, count=1)
        assert cells(row, found[row.source], readme[row.figure])[2] != edited
