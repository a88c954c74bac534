"""The label-shift references on fixed inputs (run in .venv-shift-refs: `make shift-refs`).

    .venv-shift-refs/bin/python tests/conformance/label_shift_refs.py case1.npz [case2.npz ...]

Each case holds ``valid_probs`` (N, K) and ``valid_labels`` (N,), labelled source rows; ``target_probs`` (M, K),
an unlabelled window; ``logits`` (L, K) and ``labels`` (L,) for the calibrators; ``tolerance`` and
``max_iterations`` for EM, ``bcts_ftol`` and ``bcts_gtol`` for BCTS. Prints one JSON line, a list with what each
reference estimates from each case:

- abstention 0.1.3.1 (Alexandari et al.'s code): EM's weights (``EMImbalanceAdapter``, source priors the validation
  label frequencies), BBSE's weights (``BBSEImbalanceAdapter``, hard predictions), and BCTS's temperature and biases
  (``TempScaling`` with a bias for every class), as released and run to the case's stopping rules;
- labelshift 0.2.11: BBSE (hard predictions) and MLLS (its EM) target priors and weights, and its BCTS.

labelshift's package ``__init__`` imports its training stack (torchvision, transformers, timm), which this venv leaves
out; its estimators are loaded as modules of a bare ``labelshift`` package instead, as they are. Its methods take
logits and apply a softmax, so they get log-probabilities (softmax(log p) = p).
"""

import importlib.util
import json
import sys
import types
import warnings

import numpy as np

# scikit-learn 1.9 renamed log_loss's y_pred, which labelshift's BCTS passes on every step of its optimisation
warnings.filterwarnings("ignore", category=FutureWarning)


def labelshift_modules():
    """labelshift's BBSE, MLLS and BCTemperatureScaling, without running the package's ``__init__``."""
    if "labelshift" not in sys.modules:
        spec = importlib.util.find_spec("labelshift")
        package = types.ModuleType("labelshift")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["labelshift"] = package
    from labelshift.calibrations import BCTemperatureScaling
    from labelshift.methods import BBSE, MLLS

    return BBSE, MLLS, BCTemperatureScaling


def references(path: str) -> dict:
    """What each reference estimates from the case at ``path``."""
    data = np.load(path)
    valid, labels, target = data["valid_probs"], data["valid_labels"], data["target_probs"]
    k = valid.shape[1]
    onehot = np.eye(k)[labels]
    tolerance, max_iterations = float(data["tolerance"]), int(data["max_iterations"])

    from abstention.calibration import TempScaling
    from abstention.label_shift import BBSEImbalanceAdapter, EMImbalanceAdapter

    em = EMImbalanceAdapter(estimate_priors_from_valid_labels=True, tolerance=tolerance, max_iterations=max_iterations)(
        tofit_initial_posterior_probs=target, valid_posterior_probs=valid, valid_labels=onehot
    )
    bbse = BBSEImbalanceAdapter()(
        valid_labels=onehot, tofit_initial_posterior_probs=target, valid_posterior_probs=valid
    )
    calibration_labels = np.eye(data["logits"].shape[1])[data["labels"]]
    t, biases = TempScaling(bias_positions="all")._get_optimal_t_and_biases(
        valid_preacts=data["logits"], valid_labels=calibration_labels
    )
    # the same fit run to calibkit's stopping rules (options override the tol=1e-7 abstention passes to scipy)
    tight = {"options": {"ftol": float(data["bcts_ftol"]), "gtol": float(data["bcts_gtol"]), "maxiter": 1000}}
    t_tight, biases_tight = TempScaling(bias_positions="all", lbfgs_kwargs=tight)._get_optimal_t_and_biases(
        valid_preacts=data["logits"], valid_labels=calibration_labels
    )

    BBSE, MLLS, BCTemperatureScaling = labelshift_modules()
    log_valid, log_target = np.log(valid), np.log(target)
    ls_bbse = BBSE(hard_label=True).fit(log_target, log_valid, labels)
    ls_mlls = MLLS(tolerance=tolerance, max_iterations=max_iterations).fit(log_target, log_valid, labels)
    ls_bcts = BCTemperatureScaling().fit(data["logits"], data["labels"])

    return {
        "abstention": {
            "em_weights": em.multipliers.tolist(),
            "bbse_weights": bbse.multipliers.tolist(),
            "bcts": {"temperature": float(t), "biases": np.asarray(biases).tolist()},
            "bcts_tight": {"temperature": float(t_tight), "biases": np.asarray(biases_tight).tolist()},
        },
        "labelshift": {
            "bbse_priors": ls_bbse.estim_target_dist.tolist(),
            "bbse_weights": ls_bbse.imp_weights.tolist(),
            "em_priors": ls_mlls.estim_target_dist.tolist(),
            "em_weights": ls_mlls.imp_weights.tolist(),
            "bcts": {"temperature": float(ls_bcts.temp), "biases": np.asarray(ls_bcts.biases).tolist()},
        },
    }


def main() -> None:
    print(json.dumps([references(path) for path in sys.argv[1:]]))


if __name__ == "__main__":
    main()
