"""The service of two source trees in the same run: did a change move the serving ratios of ``make bench``?

Both trees' services are measured in turn each round, the order alternating, on the ratios of ``make bench`` (light
``/predict`` against the FastAPI baseline, heavy JSON and binary v2 against onnxruntime alone). A change holds when
the median of after / before lies within the ratio's round-to-round spread (the larger max / min over the rounds of
either tree).

    python -m bench.serving.trees --before <commit> [--after <commit or folder>] [--seconds 5] [--rounds 5] [--smoke]

Commits are checked out into temporary worktrees; ``--after`` defaults to this working tree. Writes
bench/results/trees.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.common import HEAVY, LIGHT, ROOT, Server, ab_rounds, histogram_totals, service, table, write_result, wrk
from bench.serving.harness import (
    SHAPES,
    baseline_server,
    body,
    both_artifacts,
    formed_batch,
    raw_at,
    single_row_requests,
)

CLIENTS = 64
RATIOS = ("light_vs_baseline", "json_vs_raw", "binary_vs_raw")


def checkout(ref: str, work: Path) -> tuple[Path, str]:
    """A folder holding ``ref`` (a folder as it is, or a commit in a new detached worktree) and its name."""
    if Path(ref).is_dir():
        return Path(ref).resolve(), ref
    folder = work / f"tree-{ref}"
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=ROOT, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True).stdout
    return folder, commit.strip()


def measure(trees: dict[str, Path], work: Path, seconds: float, rounds: int) -> list[dict]:
    """``rounds`` rounds of every ratio on a service process per tree (prediction logging to SQLite)."""
    artifacts = both_artifacts(work)
    for manifest in artifacts.glob("*/*/manifest.json"):  # as a tree from before the optional label_shift entry reads
        entries = json.loads(manifest.read_text())
        entries.pop("label_shift", None)
        manifest.write_text(json.dumps(entries, indent=2))
    requests = single_row_requests(work, HEAVY)
    light = body(None, SHAPES[LIGHT], 1)
    # the store under its old name too, for a tree from before the settings' groups (a newer tree warns, ignores it)
    stores = {name: f"sqlite:///{work / (name + '.db')}" for name in trees}
    servers = {
        name: service(artifacts, stores[name], True, "cpu", cwd=tree, CALIB_DATABASE_URL=stores[name])
        for name, tree in trees.items()
    }
    baseline = baseline_server(artifacts / LIGHT / "1" / "model.onnx", "cpu")
    model_path = artifacts / HEAVY / "1" / "model.onnx"
    try:
        for svc in servers.values():  # warm-ups, discarded
            wrk(f"{svc.url}/predict", light, CLIENTS, 1.0)
            for path, payload, lua in requests.values():
                wrk(svc.url + path, payload, CLIENTS, 1.0, lua=lua)
        wrk(f"{baseline.url}/predict", light, CLIENTS, 1.0)
        baseline_rps: dict[int, float] = {}  # the baseline at the start of each round

        def tree_round(name: str, r: int) -> dict:
            if r not in baseline_rps:
                baseline_rps[r] = wrk(f"{baseline.url}/predict", light, CLIENTS, seconds)["requests_per_s"]
            row = {"round": r + 1, "tree": name} | one_round(servers[name], light, requests, model_path, seconds)
            return row | {"light_vs_baseline": row["light_rps"] / baseline_rps[r], "baseline_rps": baseline_rps[r]}

        return [row for runs in ab_rounds(list(servers), rounds, tree_round) for row in runs.values()]
    finally:
        for svc in [*servers.values(), baseline]:
            svc.stop()


def answered(point: dict) -> float:
    """wrk's requests/s, refused when any answer was not a 2xx: a tree that fails fast is not faster."""
    if point["non_2xx"]:
        raise RuntimeError(f"{point['non_2xx']} non-2xx answers")
    return point["requests_per_s"]


def one_round(svc: Server, light: str, requests: dict, model_path: Path, seconds: float) -> dict:
    """One server's light requests/s, and per heavy protocol its rows/s over onnxruntime alone at its batch."""
    row = {"light_rps": answered(wrk(f"{svc.url}/predict", light, CLIENTS, seconds))}
    for side, (path, payload, lua) in requests.items():
        before = histogram_totals(svc.url)
        rps = answered(wrk(svc.url + path, payload, CLIENTS, seconds, lua=lua))
        batch = max(1, round(formed_batch(svc, before, HEAVY) or 1.0))
        raw = raw_at(model_path, batch, seconds, "cpu")["rows_per_s"]
        row |= {f"{side}_rows_per_s": rps, f"{side}_batch": batch, f"{side}_vs_raw": rps / raw}
    return row


def summary(rows: list[dict], before: str, after: str) -> list[dict]:
    """Per ratio: each tree's median and range over rounds, and the median and range of after / before."""

    def spread(values: list[float]) -> str:
        values = sorted(values)
        return f"{values[len(values) // 2]:.3f} ({values[0]:.3f}-{values[-1]:.3f})"

    out = []
    for ratio in RATIOS:
        by_tree = {tree: [r[ratio] for r in rows if r["tree"] == tree] for tree in (before, after)}
        change = [a / b for a, b in zip(by_tree[after], by_tree[before])]
        spread_ = max(max(values) / min(values) for values in by_tree.values())  # each tree's own, round to round
        median = sorted(change)[len(change) // 2]
        within = 1 / spread_ <= median <= spread_
        out.append(
            {"ratio": ratio, "before": spread(by_tree[before]), "after": spread(by_tree[after])}
            | {"after / before": spread(change), "within the rounds' spread": within}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serving.trees", description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a commit or a folder")
    parser.add_argument("--after", default=str(ROOT), help="a commit or a folder (default: this working tree)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one short round")
    args = parser.parse_args()
    seconds, rounds = (1.0, 1) if args.smoke else (args.seconds, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="calib-bench-trees-"))
    made = []
    try:
        (before, before_name), (after, after_name) = checkout(args.before, work), checkout(args.after, work)
        made = [tree for tree in (before, after) if tree.is_relative_to(work)]
        names = {"before": before, "after": after}
        rows = measure(names, work, seconds, rounds)
    finally:
        for tree in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    columns = ["round", "tree", "light_rps", "baseline_rps", *RATIOS, "json_batch", "binary_batch"]
    print(f"before: {before_name}, after: {after_name}; {CLIENTS} clients, {seconds:g} s per point\n")
    print(table(rows, columns))
    result = summary(rows, "before", "after")
    print("\n" + table(result, ["ratio", "before", "after", "after / before", "within the rounds' spread"]))
    write_result(
        "trees",
        {"before": before_name, "after": after_name, "clients": CLIENTS, "seconds": seconds, "rows": rows}
        | {"summary": result},
        smoke=args.smoke,
    )


if __name__ == "__main__":
    main()
