"""README.md's figures table, written by ``write_readme`` (from ``bench.registry.write_page``) from the files the
pages are written from: a figure copied by hand stays behind when its page is rewritten.

Each row of ``ROWS`` is its figure, its goal, its source (a result, a recorded GPU run, a model's metrics.json, the
loss study), the function that writes its "recorded" cell, and the page it cites. A row whose source is missing or
lacks the measurement keeps the README's text, so that ``python -m bench --only alarm`` rewrites the alarm's rows
alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import HEAVY, LIGHT, ROOT, load_result

README = ROOT / "README.md"
FILES = {"report": ROOT / "artifacts" / LIGHT / "1" / "metrics.json", "study": ROOT / "docs" / "study" / "study.json"}
BENCH_SOURCES = ("alarm", "serving", "conformal")
HEADER = "| figure | goal or guarantee | recorded | page |\n| --- | --- | --- | --- |"
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class Row:
    """A README row: ``recorded(source)`` is its "recorded" cell, ``page`` (or ``page(source)``) the page it cites;
    the cell's text from ``kept`` on cites another page's figures and is kept as the README has it."""

    figure: str
    goal: str
    source: str
    recorded: Callable[[dict], str]
    page: str | Callable[[dict], str]
    kept: str = ""


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")


def gpu_runs() -> list[dict]:
    """The recorded GPU runs in docs/benchmarks.md's order, each with its ``stem`` and its heading's ``anchor``."""
    from bench.gpu import RECORDED, recorded_section

    runs = {path.stem: json.loads(path.read_text()) for path in RECORDED.glob("*.json")}
    found = (
        re.match(r"## (GPU (?:run |settings sweep \()([\w.-]+?)[,:)].*)", h) for h in recorded_section().split("\n")
    )
    return [runs[h.group(2)] | {"stem": h.group(2), "anchor": slug(h.group(1))} for h in found if h]


def sources(fresh: dict[str, dict] | None = None, results: bool = True) -> dict[str, dict | None]:
    """Every row's source by name (None where missing; ``fresh`` results first, no result without ``results``); the
    GPU sources are the latest engine run, the latest with plain replicas, and the latest device run."""
    out = {name: ((fresh or {}).get(name) or load_result(name)) if results else None for name in BENCH_SOURCES}
    out |= {name: json.loads(path.read_text()) if path.exists() else None for name, path in FILES.items()}
    runs = gpu_runs()
    engine = [r for r in runs if r["recorded"].get("kind") == "engine"]
    replicas = [r for r in engine if any(p["frontends"] == "2 replicas" for p in r["points"])]
    device = [r for r in runs if "kind" not in r["recorded"] and "settings" not in r]
    for name, chosen in (("engine", engine), ("engine with replicas", replicas), ("device", device)):
        out[name] = chosen[-1] if chosen else None
    return out


def _goal(result: dict, *words: str) -> dict:
    """The first goal row whose name holds every one of ``words``."""
    return next(g for g in result["goals"] if all(w in g["goal"] for w in words))


def _worst(result: dict, *words: str) -> str:
    """The first number of that goal's ``worst``, as the page prints it."""
    return NUMBER.search(_goal(result, *words)["worst"]).group()  # type: ignore[union-attr]


def _met(result: dict, *words: str) -> tuple[str, ...]:
    """The "N of M" of that goal's ``worst``."""
    return re.search(r"(\d+) of (\d+)(?: rows)? met", _goal(result, *words)["worst"]).groups()  # type: ignore[union-attr]


def _ratios(result: dict, goals: list[tuple[str, ...]]) -> str:
    """The measured values of ``goals`` (each the words of one goal), " / " between them."""
    return " / ".join(f"{_goal(result, *words)['measured']:.2f}" for words in goals)


def _e2e(r: dict) -> str:
    alarms = _worst(r, "no coverage alarm")
    where = _goal(r, "every delay: at least")["worst"].split(", ", 1)[1].replace(" delay ", ", delay ")
    return (
        f"at least {_worst(r, 'every delay: at least')} of the windows in every cell (worst: {where}); overall "
        f"coverage worst {_worst(r, 'overall coverage')}; {_worst(r, 'no empty set')} empty sets; "
        + ("no alarm" if alarms == "0" else f"{alarms} streams alarmed")
        + f" in any of the {_goal(r, 'no coverage alarm')['rows']} cells; size worst "
        f"{_worst(r, 'exchangeable, every delay: mean set size')}x"
    )


def _after_shift(r: dict) -> str:
    g = _goal(r, "after a shift, every delay: coverage")
    return f"worst {_worst(r, g['goal'])}, {g['rows'] if g['met'] is True else 'not all'} of {g['rows']} streams"


def _engine(run: dict) -> str:
    """The heavy model's binary goal at 128 clients, at its W: against the batch formed and the bucket padded to."""
    g = _goal(run, "heavy, binary, 128 clients")
    w, batch = re.match(r"W = (\S+), batch ([\d.]+)", g["at"]).groups()  # type: ignore[union-attr]
    key = (w, HEAVY, "binary", 128)
    point = next(p for p in run["points"] if (p["frontends"], p["model"], p["protocol"], p["clients"]) == key)
    padded = "not recorded" if point.get("vs_padded") is None else f"{point['vs_padded']:.2f}"
    return f"{g['measured']:.2f} / {padded}, W = {w}, batch {batch}"


def _replicas(run: dict) -> str:
    g = _goal(run, "heavy, binary, 128 clients")
    pod, pair = g["at"].replace(" at ", " (").split("; 2 replicas ")
    return f"pod {g['measured']:.2f} ({pod}); 2 plain replicas {pair})"


def _report(metrics: dict) -> str:
    before, after = metrics["test"]["before"], metrics["test"]["after"]
    return ", ".join(f"{k.upper()} {before[k]['value']:.4f} -> {after[k]['value']:.4f}" for k in ("ece", "nll"))


def _study(study: dict) -> str:
    ece = {row["loss"]: 100 * row["pre"]["ece"]["mean"] for row in study["rows"]}
    return f"{ece['ce']:.2f}% against {ece['flsd53']:.2f}%"


def _run_page(run: dict) -> str:
    return f"[benchmarks, {run['stem']}](docs/benchmarks.md#{run['anchor']})"


ALARM = "[alarm benchmark](docs/alarm_benchmark.md#goals)"
SERVING = "[benchmarks](docs/benchmarks.md#goals)"
CONFORMAL = "[conformal benchmark](docs/conformal_benchmark.md#goals)"
SORT_FLOOR = "(where numpy's SIMD sort runs: the page prints the machine's sort floor)"
# fmt: off
ROWS = [
    Row("default model, test ECE and NLL before -> after temperature scaling",
        "lower after, for the committed split and the median of 20 splits of validation", "report", _report,
        "[report](artifacts/digits-lenet5/1/report.md)", kept="; median of"),
    Row("false alarms in 10,000 calibrated or tolerance-edge labels",
        "mean time to a false alarm >= 12,500 labels; <= 1% a row", "alarm",
        lambda r: f"<= {_worst(r, 'false alarms <=')}% on {_goal(r, 'false alarms <=')['rows']} rows", ALARM),
    Row("detection delay, within 1.5x of an oracle told the shift / told only the list of shifts", "every row",
        "alarm", lambda r: "{} / {} of {} rows".format(
            _met(r, "detection", "of the oracle")[0], *_met(r, "detection", "blind oracle on")), ALARM),
    Row("clearing delay, within 1.5x of an oracle told the shift", "every row", "alarm",
        lambda r: "{} of {} rows".format(*_met(r, "clearing: median within", "of the oracle")), ALARM),
    Row("light `/predict` against plain FastAPI + onnxruntime, 64 clients", ">= 1.5x", "serving",
        lambda r: f"{_goal(r, 'light: service requests/s')['measured']:.1f}x", SERVING),
    Row("heavy model, share of onnxruntime alone: JSON / v2 binary / gRPC", ">= 0.9", "serving",
        lambda r: _ratios(r, [("heavy on", f"through {side}") for side in ("JSON", "v2 binary", "gRPC")]), SERVING),
    Row("feedback in batches of 1,000", ">= 5,000 labels/s", "serving",
        lambda r: f"{_goal(r, 'feedback labels/s')['measured']:,.0f} labels/s", SERVING),
    Row("prediction sets under 38 shifted streams, adaptation on, labels folded one by one: long-run coverage at a "
        "0.9 target", "at least 0.89, every stream", "conformal",
        lambda r: f"worst {_worst(r, 'long-run coverage')}", CONFORMAL),
    Row("prediction sets at 1,000 classes, per 64-row batch, every method", "<= 0.5 ms", "conformal",
        lambda r: "worst {} ms, {} of {} {}".format(_worst(r, "cost: sets of 64"), *_met(r, "cost: sets of 64"),
                                                   SORT_FLOOR),
        "[conformal benchmark](docs/conformal_benchmark.md#cost-per-batch)"),
    Row("prediction sets through the service, labels 0 to 10,000 predictions late in batches: windows of 1,000 at "
        "a 0.9 target, in-distribution", ">= 0.87 in 99% of the 100 windows of each data set and delay, no empty "
        "set, no alarm; set size <= 1.1x the static sets'", "conformal", _e2e, CONFORMAL),
    Row("the same after a shift: coverage from the delay's end", ">= 0.89 at every delay", "conformal",
        _after_shift, CONFORMAL),
    Row("loss study, ECE before T: cross-entropy against FLSD-53", "FLSD-53 lower", "study", _study,
        "[study](docs/study/study.md)"),
    Row("GPU pod, latest engine run: heavy model, v2 binary, 128 single-row clients, rows/s ÷ onnxruntime alone "
        "at the batch formed / at the bucket it is padded to, at the best W", ">= 0.8 at the batch formed",
        "engine", _engine, _run_page),
    Row("GPU pod against two plain replicas (the latest engine run with them): the same ratio at the batch formed",
        ">= 0.8 for the pod; the replicas reported beside it", "engine with replicas", _replicas, _run_page),
    Row("GPU serving run (`python -m bench.gpu`), latest: heavy model, 64 single-row clients, v2 binary / JSON, "
        "rows/s ÷ the no-batching baseline; ÷ onnxruntime alone at the batch formed", ">= 3; >= 0.8", "device",
        lambda run: "; ".join(_ratios(run, [("heavy on", f", {side}: rows/s", what) for side in ("binary", "json")])
                              for what in ("no-batching baseline", "formed batch")), _run_page),
]
# fmt: on


def _span(text: str) -> tuple[int, int]:
    """Where the table under ``## Figures`` starts and ends in the README's text."""
    start = text.index("| figure", text.index("## Figures"))
    end = text.find("\n\n", start)
    return start, len(text) if end < 0 else end


def current_rows(text: str) -> dict[str, list[str]]:
    """The README's figures table (``text``: the README), its cells by figure."""
    lines = text[slice(*_span(text))].splitlines()[2:]
    return {c[0]: c for c in ([cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines)}


def _page(row: Row, source: dict | None) -> str:
    return row.page if isinstance(row.page, str) else row.page(source) if source else ""


def cells(row: Row, source: dict, current: list[str] | None = None) -> list[str]:
    """``row``'s four cells from its source, its ``kept`` part from ``current`` (the README's cells)."""
    recorded = row.recorded(source)
    if row.kept and current and row.kept in current[2]:
        recorded += current[2][current[2].index(row.kept) :]
    return [row.figure, row.goal, recorded, _page(row, source)]


def readme_table(fresh: dict[str, dict] | None = None, text: str | None = None, results: bool = True) -> str:
    """The figures table: each row from its source (``sources``), or as the README (``text``) has it."""
    found, current, lines = sources(fresh, results), current_rows(text or README.read_text()), [HEADER]
    for row in ROWS:
        source, old = found[row.source], current.get(row.figure)
        try:
            new = cells(row, source, old) if source else None
        except (LookupError, StopIteration, AttributeError, TypeError):
            new = None
        new = new or old or [row.figure, row.goal, "not yet measured", _page(row, source)]
        lines.append("| " + " | ".join(new) + " |")
    return "\n".join(lines)


def write_readme(fresh: dict[str, dict] | None = None, readme: Path | None = None, results: bool = True) -> None:
    """Replace the figures table of README.md (or ``readme``) with ``readme_table``; the rest stays as it is."""
    path = readme or README
    text = path.read_text()
    start, end = _span(text)
    new = text[:start] + readme_table(fresh, text, results) + text[end:]
    if new != text:
        path.write_text(new)
