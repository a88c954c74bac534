"""Run every benchmark and write docs/benchmarks.md from their JSON results.

    python -m bench.run_all [--smoke]       (make bench; --smoke: seconds, for CI, times not asserted)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.common import RESULTS, ROOT, machine, table

BENCHMARKS = ("fit_temperature", "training", "serving", "monitoring")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", nargs="*", default=list(BENCHMARKS))
    args = parser.parse_args()
    for name in args.only:
        print(f"\n=== {name}", flush=True)
        subprocess.run([sys.executable, "-m", f"bench.{name}", *(["--smoke"] if args.smoke else [])], check=True,
                       cwd=ROOT)
    if not args.smoke:
        (ROOT / "docs" / "benchmarks.md").write_text(render())
        print(f"\nwrote {ROOT / 'docs' / 'benchmarks.md'}")


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render() -> str:
    m = machine()
    out = ["# Benchmarks", "",
           f"Measured by `make bench` on {m['cores']} cores of \"{m['cpu']}\", {m['memory_gib']} GiB, no GPU, "
           f"Python {m['python']}, at commit `{m['commit']}`. Client (wrk) and server share the machine; absolute "
           "numbers drift on shared machines, so goals are stated as ratios measured in one run.", ""]
    fit = _load("fit_temperature")
    if fit:
        out += ["## fit_temperature", "", table(fit["results"], ["objective", "n", "classes", "fitted_T", "best_s",
                                                                  "median_s"]), ""]
    training = _load("training")
    if training:
        out += ["## Training: the default `python -m training run`", "",
                table([training], ["job", "seconds", "peak_rss_mib"]), ""]
    serving = _load("serving")
    if serving:
        out += ["## Serving", "", f"{serving['seconds_per_point']} s per load point after a warm-up, wrk with one "
                "thread on loopback. `service`: this service (dynamic batching, prediction logging to SQLite); "
                "`baseline`: a plain FastAPI endpoint calling onnxruntime once per request.", ""]
        for model, rows in serving["raw"].items():
            out += [f"onnxruntime alone, {model}:", "", table(rows, ["batch", "rows_per_s", "ms_per_call"]), ""]
        out += [table(serving["load"], ["server", "model", "rows", "clients", "requests_per_s", "rows_per_s",
                                        "p50_ms", "p99_ms", "non_2xx"]), "", "Prediction logging:", "",
                table(serving["logging"], ["logging", "model", "clients", "rows_per_s", "p50_ms", "p99_ms"]), "",
                "Mean seconds per request from the service's own histograms (total /predict, queue, inference):", "",
                "```", json.dumps(serving["split"], indent=1), "```", "", "### Goals", "",
                table(serving["goals"], ["goal", "measured", "target", "met"]), ""]
    monitoring = _load("monitoring")
    if monitoring:
        out += ["## Monitoring", "", f"{monitoring['rows']} labelled predictions stored (SQLite).", "",
                "GET /calibration:", "", table(monitoring["calibration"], ["window", "p50_ms", "p99_ms", "requests"]),
                "", "POST /feedback:", "", table([monitoring["feedback"]], ["batch", "labels_per_s", "labels"]), ""]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
