"""``python -m training <command>``: train, calibrate, evaluate, export, run, study.

Settings come from ``--config FILE.yaml`` with command-line flags on top. Bad settings, missing
data and missing run files fail fast with one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from training import pipeline
from training.config import ConfigError, load_config
from training.conformal import DEFAULT_FRACTION

DEFAULT_RUN_DIR = Path("runs")
DEFAULT_ARTIFACTS = Path("artifacts")


def _loss_param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--loss-param takes KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


CHECKPOINT_HELP = (
    "which epoch's weights to keep: last (default: the final epoch, the papers' protocol), best-accuracy (the "
    "highest validation accuracy, ties to the lower validation NLL) or best-nll (the lowest validation NLL)"
)


CONFORMAL_FRACTION_HELP = (
    "share of the validation split kept apart (stratified, drawn by the seed) for the conformal scores written to "
    "conformal.json; the calibration is fitted on the rest (default 0.5; 0: no conformal scores, calibration on all "
    "of validation)"
)


def _config_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("run settings (override --config)")
    g.add_argument("--config", type=Path, help="YAML file with run settings")
    g.add_argument("--dataset", help="digits (default, bundled), cifar10 or image_folder")
    g.add_argument("--data-path", type=Path, help="local data directory (cifar10, image_folder)")
    g.add_argument("--classes", type=lambda s: [c.strip() for c in s.split(",")], help="cifar10 subset, e.g. bird,cat")
    g.add_argument("--image-size", type=int)
    g.add_argument(
        "--model",
        help="lenet5, resnet20, resnet56, resnet110, resnet50, densenet_bc, wrn16_4, wrn28_10, "
        "or with the [vision] extra torchvision:<architecture> (resnet18/34/50/101/152, resnext*, "
        "wide_resnet*, densenet121/161/169/201)",
    )
    g.add_argument(
        "--weights",
        type=Path,
        help="torchvision:* models: local state-dict file of pretrained weights "
        "(e.g. ImageNet); the classification layer is replaced; nothing is downloaded",
    )
    g.add_argument(
        "--finetune",
        metavar="{all,head}",
        help="with --weights: train all layers (default) or only the new classification layer",
    )
    g.add_argument(
        "--input-size",
        type=int,
        help="resize images to this side inside the network (e.g. 224 for "
        "ImageNet weights); clients still send the data set's size",
    )
    g.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="standard CIFAR augmentation (random crop "
        "with padding, horizontal flip; torchvision's transforms, [vision] extra)",
    )
    g.add_argument("--loss", help="ce, label_smoothing, focal, flsd53, mbls, brier, mmce, entropy_penalty")
    g.add_argument("--loss-param", type=_loss_param, action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--epochs", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--optimizer", help="sgd, adam or adamw")
    g.add_argument("--lr", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--schedule", help="cosine, step or constant")
    g.add_argument(
        "--milestones",
        type=_floats,
        help="step schedule: fractions of the epochs where the lr drops 10x (default 0.5,0.75)",
    )
    g.add_argument("--checkpoint", metavar="{last,best-accuracy,best-nll}", help=CHECKPOINT_HELP)
    g.add_argument("--train-size", type=int, help="train on a stratified subset of this many training images")
    g.add_argument("--label-noise", type=float, help="fraction of the labels of every split changed at random")
    g.add_argument("--seed", type=int)
    g.add_argument("--calibration", help="temperature (default), vector, bcts, platt, histogram, isotonic")
    g.add_argument("--calibration-objective", help="nll (default) or ece (grid search)")
    g.add_argument("--conformal-fraction", type=float, help=CONFORMAL_FRACTION_HELP)
    g.add_argument("--n-resamples", type=int, help="bootstrap resamples on the test split")
    g.add_argument("--n-resamples-shifted", type=int, help="bootstrap resamples per corrupted set")
    g.add_argument("--name", help="artifact name (default <dataset>-<model>[-<loss>])")
    g.add_argument("--version", help="artifact version (default: next free number)")


def _config(args: argparse.Namespace):
    overrides = {
        k: getattr(args, k)
        for k in (
            "dataset",
            "data_path",
            "classes",
            "image_size",
            "model",
            "weights",
            "finetune",
            "input_size",
            "augment",
            "loss",
            "epochs",
            "batch_size",
            "optimizer",
            "lr",
            "weight_decay",
            "schedule",
            "milestones",
            "checkpoint",
            "train_size",
            "label_noise",
            "seed",
            "calibration",
            "calibration_objective",
            "conformal_fraction",
            "n_resamples",
            "n_resamples_shifted",
            "name",
            "version",
        )
    }
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
    p.add_argument("--conformal-fraction", type=float, help=CONFORMAL_FRACTION_HELP.replace("validation split", "data"))
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
        type=_ints,
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

            summary = calibrate_onnx(
                args.onnx,
                args.data,
                name=args.name,
                artifacts=args.artifacts,
                class_names=args.class_names,
                method=args.method or "temperature",
                objective=args.objective or "nll",
                output_name=args.output_name,
                probabilities=args.probabilities,
                conformal_fraction=DEFAULT_FRACTION if args.conformal_fraction is None else args.conformal_fraction,
                seed=args.seed,
                version=args.version,
                overwrite=args.overwrite,
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
