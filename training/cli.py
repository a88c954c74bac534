"""``python -m training <command>``: train, calibrate, evaluate, export, run, study.

Settings come from ``--config FILE.yaml`` with command-line flags on top. Bad settings, missing
data and missing run files fail fast with one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import UnionType
from typing import Literal, get_args, get_origin

import yaml

from training import pipeline
from training.config import ConfigError, RunConfig, load_config
from training.conformal import DEFAULT_FRACTION

DEFAULT_RUN_DIR = Path("runs")
DEFAULT_ARTIFACTS = Path("artifacts")
FRACTION_HELP = RunConfig.model_fields["conformal_fraction"].description or ""
#: Settings only a --config file sets.
NO_FLAG = {"momentum", "n_bins", "corruptions", "severities", "ood"}


def _loss_param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--loss-param takes KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _listed(kind: type):
    """An argparse type for a comma-separated list of ``kind``."""

    def parse(text: str) -> list:
        try:
            return [kind(v.strip()) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") from None

    return parse


def _flag_options(annotation) -> dict:
    """argparse options for a setting's type: bools --x/--no-x, literals' choices shown, lists comma-separated."""
    kind = get_args(annotation)[0] if isinstance(annotation, UnionType) else annotation  # X of X | None
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction, "default": None}
    if get_origin(kind) is Literal:
        return {"metavar": "{" + ",".join(get_args(kind)) + "}"}
    return {"type": _listed(get_args(kind)[0]) if get_origin(kind) is list else kind}


def _config_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per ``RunConfig`` field but ``NO_FLAG``, named and described as it (``--loss-param``: ``loss_params``)."""
    g = parser.add_argument_group("run settings (override --config)")
    g.add_argument("--config", type=Path, help="YAML file with run settings")
    for name, field in RunConfig.model_fields.items():
        if name == "loss_params":
            g.add_argument("--loss-param", type=_loss_param, action="append", default=[], metavar="KEY=VALUE")
        elif name not in NO_FLAG:
            g.add_argument(f"--{name.replace('_', '-')}", help=field.description, **_flag_options(field.annotation))


def _config(args: argparse.Namespace):
    overrides = {k: v for k, v in vars(args).items() if k in RunConfig.model_fields}
    if args.loss_param:
        overrides["loss_params"] = dict(args.loss_param)
    if args.command == "study":
        from training.study import study_config

        if args.seed is not None:
            raise ConfigError("the study takes --seeds (a comma-separated list), not --seed")
        return study_config(args.config, **overrides)
    return load_config(args.config, **overrides)


def _run_dir(args, config=None) -> Path:
    if args.run_dir is not None:
        return args.run_dir
    if config is None:
        raise ConfigError("--run-dir is required for this command")
    return DEFAULT_RUN_DIR / config.model_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model and keep the checkpoint that --checkpoint selects")
    _config_flags(p)
    p.add_argument("--run-dir", type=Path, help="default runs/<name>")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("calibrate", help="fit post-hoc calibration on the validation split (or on your own ONNX model)")
    p.add_argument("--run-dir", type=Path, help="a run directory written by `train`")
    p.add_argument("--method", help="temperature, vector, bcts, platt, histogram, isotonic")
    p.add_argument("--objective", help="temperature objective: nll or ece")
    p.add_argument("--conformal-fraction", type=float, help=FRACTION_HELP.replace("validation split", "data"))
    byom = p.add_argument_group(
        "bring your own model (instead of --run-dir): writes <artifacts>/<name>/<next version>/, served as it is"
    )
    byom.add_argument("--onnx", type=Path, help="your ONNX classifier: one float32 input, [N, F] or [N, C, H, W]")
    byom.add_argument("--data", type=Path, help=".npz with x (N, ...) inputs and y (N,) labels (indices or names)")
    byom.add_argument("--name", help="the artifact's model name (default: the ONNX file's stem)")
    byom.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help="default artifacts/")
    byom.add_argument("--class-names", type=Path, help='a JSON list or one name a line (default "0".."K-1")')
    byom.add_argument("--output-name", help="ONNX output holding logits or probabilities (default: found)")
    byom.add_argument(
        "--probabilities", action="store_true", help="the output holds probabilities, not logits (implied by a ZipMap)"
    )
    byom.add_argument("--version", help="default: one more than the highest version")
    byom.add_argument("--overwrite", action="store_true", help="replace an existing version")
    byom.add_argument("--seed", type=int, default=0, help="draws the conformal split and the randomized scores")

    p = sub.add_parser("evaluate", help="metrics before/after calibration on test, corruptions and OOD; report + plots")
    p.add_argument("--run-dir", type=Path, required=True)

    p = sub.add_parser("export", help="write artifacts/<name>/<version>/ with model.onnx and manifest.json")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS)
    p.add_argument("--version")
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("run", help="train, calibrate, evaluate and export in one go")
    _config_flags(p)
    p.add_argument("--run-dir", type=Path, help="default runs/<name>")
    p.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS)
    p.add_argument("--overwrite", action="store_true", help="replace an existing artifact version")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser(
        "study",
        help="Mukhoti et al. Table 1 over seeds: ECE before/after temperature scaling per loss",
        description="Defaults: the papers' protocol scaled to digits (training.study.STUDY_PROTOCOL: "
        "SGD, steps at 150/350 and 250/350, final model, 30%% label noise); --config and "
        "flags override it.",
    )
    _config_flags(p)
    p.add_argument(
        "--seeds",
        type=_listed(int),
        default=None,
        help="comma-separated seeds (default 0,1,2,3,4); each draws the split, the noise and the initialisation",
    )
    p.add_argument("--output", type=Path, default=Path("docs/study"), help="directory for study.md and study.json")
    p.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "train":
        config = _config(args)
        result = pipeline.train_step(config, _run_dir(args, config), progress=not args.no_progress)
        kept = result.history[result.best_epoch - 1]
        print(
            f"kept epoch {result.best_epoch} of {config.epochs} ({config.checkpoint}): val accuracy "
            f"{kept['val_accuracy']:.4f}, val NLL {kept['val_nll']:.4f}, val ECE {kept['val_ece']:.4f} -> "
            f"{_run_dir(args, config) / pipeline.CHECKPOINT}"
        )
    elif args.command == "calibrate":
        if args.onnx is not None:
            from training.byom import calibrate_onnx

            same = ("name", "artifacts", "class_names", "output_name", "probabilities", "seed", "version", "overwrite")
            summary = calibrate_onnx(
                args.onnx,
                args.data,
                method=args.method or "temperature",
                objective=args.objective or "nll",
                conformal_fraction=DEFAULT_FRACTION if args.conformal_fraction is None else args.conformal_fraction,
                **{option: getattr(args, option) for option in same},  # the flags named as calibrate_onnx's options
            )
            print(json.dumps(summary, indent=2))
            return 0
        calibrator = pipeline.calibrate_step(_run_dir(args), args.method, args.objective, args.conformal_fraction)
        print(f"{calibrator.method}: {json.dumps(calibrator.to_dict()['params'])[:200]}")
    elif args.command == "evaluate":
        evaluation = pipeline.evaluate_step(args.run_dir)
        _print_test(evaluation)
        print(f"report: {args.run_dir / 'report.md'}")
    elif args.command == "export":
        directory, parity = pipeline.export_step(args.run_dir, args.artifacts, args.version, args.overwrite)
        _print_parity(parity)
        print(f"artifact: {directory}")
    elif args.command == "run":
        config = _config(args)
        out = pipeline.run(
            config, _run_dir(args, config), args.artifacts, args.overwrite, progress=not args.no_progress
        )
        _print_test(out["evaluation"])
        _print_parity(out["parity"])
        print(f"artifact: {out['artifact']}  (report: {Path(out['artifact']) / 'report.md'})")
        print("seconds: " + ", ".join(f"{k} {v}" for k, v in out["seconds"].items()))
    elif args.command == "study":
        from training.study import DEFAULT_SEEDS, run_study

        table = run_study(_config(args), args.output, seeds=args.seeds or DEFAULT_SEEDS, progress=not args.no_progress)
        print(table)
    return 0


def _print_test(evaluation: dict) -> None:
    print(f"{'test metric':<16}{'before calibration':>30}{'after calibration':>30}")
    for metric, before in evaluation["test"]["before"].items():
        after = evaluation["test"]["after"][metric]
        cells = [f"{e['value']:.4f} [{e['ci'][0]:.4f}, {e['ci'][1]:.4f}]" for e in (before, after)]
        print(f"{metric:<16}{cells[0]:>30}{cells[1]:>30}")


def _print_parity(parity: dict) -> None:
    print(
        f"ONNX parity on {parity['n']} validation images: max |diff| logits {parity['max_abs_diff_logits']:.2e}, "
        f"probabilities {parity['max_abs_diff_probabilities']:.2e}"
    )
