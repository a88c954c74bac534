"""The checkpoint policy (--checkpoint last|best-accuracy|best-nll), the harder training sets and the study."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from calibkit import metrics
from calibkit.temperature import softmax
from training.cli import main
from training.config import ConfigError, RunConfig, load_config
from training.data import load_digits_splits, subsample_train, with_label_noise
from training.inference import predict_logits
from training.pipeline import load_splits
from training.trainer import load_checkpoint, save_checkpoint, select_epoch, train

#: Few images, a large step and no decay: validation accuracy peaks before the last epoch.
BUMPY = {"epochs": 8, "train_size": 100, "optimizer": "sgd", "lr": 0.5, "schedule": "constant", "batch_size": 32}


def _history(*rows):
    return [{"epoch": i + 1, "val_accuracy": acc, "val_nll": nll} for i, (acc, nll) in enumerate(rows)]


def test_select_epoch_implements_each_policy():
    history = _history((0.80, 0.50), (0.90, 0.45), (0.90, 0.40), (0.85, 0.30), (0.70, 0.60))
    assert select_epoch(history, "last") == 5
    assert select_epoch(history, "best-accuracy") == 3  # ties on accuracy go to the lower NLL
    assert select_epoch(history, "best-nll") == 4
    assert select_epoch(_history((0.9, 0.3), (0.9, 0.3)), "best-accuracy") == 1  # full ties: the earliest
    with pytest.raises(ValueError, match="checkpoint policy must be one of last, best-accuracy, best-nll"):
        select_epoch(history, "best")
    with pytest.raises(ValueError, match="no epochs"):
        select_epoch([], "last")


@pytest.fixture(scope="module")
def bumpy_runs():
    config = load_config(**BUMPY)
    splits = load_splits(config)
    runs = {
        policy: train(config.model_copy(update={"checkpoint": policy}), splits, progress=False)
        for policy in ("last", "best-accuracy", "best-nll")
    }
    return splits, runs


def _val_scores(model, splits):
    probs = softmax(predict_logits(model, splits.val.x))
    return metrics.accuracy(probs, splits.val.y), metrics.nll(probs, splits.val.y)


def test_each_policy_returns_the_weights_of_the_epoch_it_selects(bumpy_runs):
    splits, runs = bumpy_runs
    history = runs["last"].history
    for policy, result in runs.items():
        assert result.history == history  # the policy never changes training, only which weights are kept
        assert result.best_epoch == select_epoch(history, policy)
        kept = history[result.best_epoch - 1]
        accuracy, nll = _val_scores(result.model, splits)
        assert accuracy == pytest.approx(kept["val_accuracy"]) and nll == pytest.approx(kept["val_nll"], rel=1e-5)
    assert runs["last"].best_epoch == BUMPY["epochs"]
    assert runs["best-accuracy"].best_epoch < BUMPY["epochs"]  # this run peaks early, so the policies differ
    assert runs["best-nll"].best_epoch == 1 + int(np.argmin([row["val_nll"] for row in history]))
    last, best = runs["last"].model.state_dict(), runs["best-accuracy"].model.state_dict()
    assert any(not torch.equal(last[k], best[k]) for k in last if last[k].is_floating_point())


def test_the_checkpoint_file_keeps_the_policy_and_the_kept_epoch(bumpy_runs, tmp_path):
    _, runs = bumpy_runs
    config = load_config(**BUMPY, checkpoint="best-nll")
    save_checkpoint(runs["best-nll"], config, tmp_path / "checkpoint.pt")
    loaded, loaded_config = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded_config.checkpoint == "best-nll" and loaded.best_epoch == runs["best-nll"].best_epoch
    state = runs["best-nll"].model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in loaded.model.state_dict().items())


def test_default_recipe_trains_to_convergence_and_bad_values_are_refused(capsys):
    config = RunConfig()  # the final model of 60 epochs without weight decay: over-confident, for T to repair
    assert (config.checkpoint, config.epochs, config.weight_decay) == ("last", 60, 0.0)
    default_job = Path(__file__).resolve().parents[2] / "configs" / "digits_lenet5_ce.yaml"
    assert load_config(default_job) == config  # the config file that says it is the default job is
    with pytest.raises(ConfigError, match="checkpoint: Input should be 'last', 'best-accuracy' or 'best-nll'"):
        load_config(checkpoint="final")
    assert main(["train", "--checkpoint", "best", "--epochs", "1"]) == 2
    assert (
        "error: invalid configuration: checkpoint: Input should be 'last', 'best-accuracy' or 'best-nll'"
        in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=r"milestones must be increasing fractions in \(0, 1\)"):
        load_config(milestones=[0.75, 0.5])
    with pytest.raises(ConfigError, match="label_noise: Input should be less than 1"):
        load_config(label_noise=1.0)


def test_cli_train_prints_the_kept_epoch_and_policy(tmp_path, capsys):
    argv = ["train", "--epochs", "2", "--checkpoint", "last", "--no-progress", "--run-dir", str(tmp_path)]
    assert main(argv) == 0
    assert "kept epoch 2 of 2 (last)" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "checkpoint.pt")[1].checkpoint == "last"


def test_training_subset_is_stratified_and_label_noise_hits_every_split():
    clean = load_digits_splits(seed=3)
    small = subsample_train(clean, 150, seed=3)
    assert len(small.train) == 150 and np.bincount(small.train.y).min() >= 14
    assert (len(small.val), len(small.test)) == (len(clean.val), len(clean.test))
    with pytest.raises(ValueError, match="train_size must lie in"):
        subsample_train(clean, 5)
    noisy = with_label_noise(clean, 0.2, seed=3)
    for part in ("train", "val", "test"):
        before, after = getattr(clean, part), getattr(noisy, part)
        assert np.mean(before.y != after.y) == pytest.approx(0.2, abs=0.002)
        assert np.array_equal(before.x, after.x)
    assert np.array_equal(with_label_noise(clean, 0.2, seed=3).train.y, noisy.train.y)
    config_splits = load_splits(load_config(train_size=150, label_noise=0.2, seed=3))
    assert len(config_splits.train) == 150
    assert np.mean(config_splits.test.y != clean.test.y) == pytest.approx(0.2, abs=0.002)


def test_study_defaults_to_the_papers_protocol():
    from training.study import STUDY_PROTOCOL, study_config

    config = study_config()
    assert (config.checkpoint, config.optimizer, config.schedule, config.calibration_objective) == (
        "last",
        "sgd",
        "step",
        "ece",
    )
    assert config.milestones == pytest.approx([150 / 350, 250 / 350])
    assert config.label_noise == STUDY_PROTOCOL["label_noise"] == 0.3
    assert study_config(epochs=3, checkpoint="best-nll").model_dump(include={"epochs", "checkpoint"}) == {
        "epochs": 3,
        "checkpoint": "best-nll",
    }


def test_study_over_seeds_writes_the_table_claims_and_machine(tmp_path, capsys):
    from training.study import STUDY_LOSSES

    argv = [
        "study",
        "--seeds",
        "0,1",
        "--epochs",
        "1",
        "--n-resamples",
        "10",
        "--output",
        str(tmp_path),
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    study = json.loads((tmp_path / "study.json").read_text())
    assert (tmp_path / "study.md").read_text() == printed.removesuffix("\n")
    assert study["seeds"] == [0, 1] and study["config"]["checkpoint"] == "last"
    assert [r["loss"] for r in study["rows"]] == [loss for _, loss, _ in STUDY_LOSSES]
    for row in study["rows"]:
        assert row["epoch"] == [1]  # checkpoint last: the final (only) epoch
        for entry in (row["temperature"], row["pre"]["ece"], row["post"]["ece"], row["pre"]["error"]):
            assert len(entry["per_seed"]) == 2 and entry["mean"] == pytest.approx(np.mean(entry["per_seed"]))
            assert entry["ci"][0] <= entry["ci"][1]
    assert [type(c.get("holds")) for c in study["claims"][:4]] == [bool] * 4
    assert {c["outcome"] for c in study["claims"][4:]} <= {"lower", "higher", "no difference"}
    assert len(study["claims"]) == 4 + len(STUDY_LOSSES) - 1
    assert "cores" in study["machine"] and study["seconds"]["total"] > 0
    assert printed.count("\n| Cross-Entropy |") == 2 and "seeds 0, 1" in printed and "Ordering claims" in printed
    assert main(["study", "--seed", "1", "--output", str(tmp_path)]) == 2
    assert "the study takes --seeds" in capsys.readouterr().err


def test_the_studys_intervals_lie_in_their_statistics_range():
    from calibkit.bootstrap import RunsBootstrap
    from training.study import _summary

    # seeds' ECEs near 1 whose resampled means spread below: the basic interval's reflection (2 theta - q_lo) passes 1
    boot = RunsBootstrap(("ece",), np.array([[0.93], [0.97]]), np.linspace(0.8, 1.0, 201)[:, None])
    assert boot.interval("ece").high > 1.0
    low, high = _summary(boot, "ece")["ci"]
    assert 0.0 <= low <= high == 1.0
    assert _summary(boot, "ece", (0.0, np.inf))["ci"][1] == boot.interval("ece").high  # a temperature has no top
    assert _summary(boot, "ece", None)["ci"] == [boot.interval("ece").low, boot.interval("ece").high]
