"""The registry of the benchmarks: each one's name (its package ``bench.<name>``), in the order ``python -m bench``
runs them, and the page it writes; a page that several share is put together here."""

from __future__ import annotations

import argparse
import importlib
import os
import time
from types import ModuleType

from bench.common import RESULTS, ROOT, Benchmark, load_result, machine, measured_by, table, write_result
from bench.figures import write_readme
from bench.gpu import HEADING, recorded_section

MAIN_PAGE = "benchmarks.md"
PAGES = {
    "fit_temperature": MAIN_PAGE,
    "training": MAIN_PAGE,
    "serving": MAIN_PAGE,
    "profile": MAIN_PAGE,
    "feedback_load": MAIN_PAGE,
    "auth": MAIN_PAGE,
    "store": "store_benchmark.md",
    "alarm": "alarm_benchmark.md",
    "conformal": "conformal_benchmark.md",
    "engine": "engine_benchmark.md",
    "shift": "shift_benchmark.md",
}


def module(name: str) -> ModuleType:
    """The package of benchmark ``name``, whose ``BENCHMARK`` holds its steps."""
    return importlib.import_module(f"bench.{name}")


def write_page(page: str, fresh: dict[str, dict] | None = None) -> None:
    """Write docs/<page> (``text``), then README.md's figures table from the same results (``bench.figures``). Results
    are not committed: until each benchmark of the page has one here, its sections stay (a lone run on a fresh clone
    would drop the others'), and only what committed files give is written, the GPU runs and their README rows."""
    path = ROOT / "docs" / page
    results = {name: (fresh or {}).get(name) or load_result(name) for name in PAGES if PAGES[name] == page}
    missing = [name for name, result in results.items() if not result]
    if not missing:
        path.write_text(text(page, results))
        write_readme(fresh)
        return
    current = path.read_text() if path.exists() else ""
    if page == MAIN_PAGE and f"\n{HEADING}" in current:
        path.write_text(current[: current.index(f"\n{HEADING}") + 1] + recorded_section())
    write_readme(results=False)
    print(f"docs/{page}: its sections kept, no result here for {', '.join(missing)} (make bench runs them all)")


def text(page: str, results: dict[str, dict | None]) -> str:
    """The page from the ``results`` of its benchmarks; the main page adds the head and the GPU runs."""
    sections = [module(name).BENCHMARK.render(result) for name, result in results.items() if result]
    if page == MAIN_PAGE:
        sections = [head(results.get("serving")), *sections, recorded_section(), ""]
    return "\n".join(sections)


def head(serving: dict | None) -> str:
    """The main page's opening: the machine of the serving run, and each benchmark's wall time in its last run."""
    m = machine()
    m["commit"] = (serving or {}).get("machine", {}).get("commit") or m["commit"]  # the run's, not the rendering's
    times = []
    for name, page in PAGES.items():
        result = load_result(name) or {}
        at = result.get("machine", {}).get("commit") or ""
        times.append({"benchmark": name, "page": page, "seconds": result.get("wall_seconds", ""), "at": at})
    paragraphs = [
        "# Benchmarks",
        measured_by("make bench", m) + " Client (wrk) and server share "
        "the machine; absolute numbers drift on shared machines, so goals are stated as ratios measured in one "
        "run. On a machine with an NVIDIA GPU: `pip install onnxruntime-gpu` (with the CUDA and cuDNN "
        "libraries it names) and `python -m bench.serving --device cuda`; the goals are then the GPU's.",
        "## Run times",
        "Each benchmark's wall time in its last run (`make bench`, `python -m bench`, runs them all in turn), "
        "and the commit it ran at:",
        table(times, "benchmark page seconds at"),
    ]
    return "\n\n".join(paragraphs) + "\n"


def main(name: str, argv: list[str] | None = None) -> None:
    """``python -m bench.<name>``: measure, judge, write bench/results/<name>.json (a smoke run: <name>-smoke.json
    and no page), print the rendering and write the page; ``--report-only`` writes the page from the stored result."""
    package = module(name)
    steps: Benchmark = package.BENCHMARK
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=" ".join((package.__doc__ or "").split("\n\n")[0].split())
    )
    parser.add_argument("--smoke", action="store_true", help="a short run that checks the benchmark works (no page)")
    parser.add_argument(
        "--report-only", action="store_true", help=f"write the page from bench/results/{name}.json, goals judged again"
    )
    steps.arguments(parser)
    args = parser.parse_args(argv)
    os.environ["BENCH_SMOKE"] = "1" if args.smoke else ""
    if args.report_only:
        stored = load_result(name)
        if stored is None:
            parser.error(f"--report-only: no {RESULTS / name}.json")
        write_page(PAGES[name], {name: stored | {"goals": steps.goals(stored)}})
        return
    start = time.perf_counter()
    result = steps.measure(args)
    if result is None:
        return
    result["goals"] = steps.goals(result)
    result["wall_seconds"] = time.perf_counter() - start
    path = write_result(name, result, smoke=args.smoke)
    print(steps.render({"machine": machine(), **result}))
    if not args.smoke:
        write_page(PAGES[name])
    print(f"wrote {path}")
