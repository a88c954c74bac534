"""calibkit's label-shift estimators and BCTS against their references on fixed inputs: abstention 0.1.3.1
(Alexandari et al.'s own code: EM, BBSE, BCTS) and labelshift 0.2.11 (BBSE, its EM, BCTS), run in a venv of their
own (`make shift-refs`: they do not install beside .venv's pins) by tests/conformance/label_shift_refs.py.

- EM: the same iteration and stopping rule as both references, so the weights agree to rounding (1e-12), also where
  the iterations run out before convergence.
- BBSE: labelshift clips negative weights and renormalises the priors as calibkit does (1e-12); abstention clips
  without renormalising, so it agrees where nothing is clipped and, where something is, after renormalising its
  priors.
- BCTS: one convex problem, stopped by different rules: abstention passes scipy tol=1e-7, calibkit stops at a
  projected gradient of 1e-9 and a relative NLL decrease of 1e-14. Run to calibkit's rules, abstention's fit agrees to
  1e-6 in T and in the probabilities; as released it stops earlier, within 1e-4, at an NLL no lower than calibkit's.
  labelshift's BCTS (finite-difference gradients, tol=1e-7) agrees within 1e-3 in the probabilities, at an NLL no
  lower than calibkit's.
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from calibkit import metrics
from calibkit.calibrators import BiasCorrectedTemperatureScaling
from calibkit.label_shift import bbse_priors, confusion_counts, em_priors
from calibkit.synthetic import calibrated_logits
from calibkit.temperature import softmax

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-shift-refs"
pytestmark = pytest.mark.e2e  # a venv of its own, built by `make shift-refs`
TOLERANCE = 1e-6


def _case(path, n_classes, logit_scale, target_priors, seed, rare=None, max_iterations=100) -> dict:
    """Labelled validation rows and a window drawn under label shift from one calibrated model (with only two rows
    predicted ``rare``), and over-confident logits with a class-0 bias for BCTS; written to ``path``."""
    z, y = calibrated_logits(40_000, n_classes=n_classes, logit_scale=logit_scale, seed=seed)
    probs = softmax(z)
    rng = np.random.default_rng(seed + 1)
    counts = rng.multinomial(2000, target_priors)
    pool = np.arange(3000, len(y))
    predicted = probs[pool].argmax(axis=1)
    rows = np.concatenate([rng.choice(pool[(y[pool] == k) & (predicted != rare)], c) for k, c in enumerate(counts)])
    if rare is not None:
        rows[:2] = pool[predicted == rare][:2]
    zc, yc = calibrated_logits(4000, n_classes=n_classes, logit_scale=3.0, seed=seed + 2)
    served = 2.5 * zc
    served[:, 0] += 1.0
    case = {
        "valid_probs": probs[:3000],
        "valid_labels": y[:3000],
        "target_probs": probs[rows],
        "logits": served,
        "labels": yc,
        "tolerance": TOLERANCE,
        "max_iterations": max_iterations,
        "bcts_ftol": 1e-14,
        "bcts_gtol": 1e-9,
    }
    np.savez(path, **case)
    return case


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Two cases: a shifted window (5 classes, accuracy about 0.74), and a window of a weak model (4 classes, logit
    scale 1.5) with no row of class 3 and two predicted 3 (labelshift's BBSE fails on a class never predicted):
    mu_hat_3 = 0.001 is far below what the other classes' confusion with 3 explains, which forces a negative w_3 for
    BBSE to clip; its EM is stopped after 10 iterations, far from converged."""
    python = VENV / "bin" / "python"
    assert python.exists(), ".venv-shift-refs is missing: run `make shift-refs`"
    root = tmp_path_factory.mktemp("label-shift-refs")
    made = {
        "shifted": _case(root / "shifted.npz", 5, 3.0, [0.5, 0.25, 0.13, 0.08, 0.04], seed=61),
        "clipped": _case(root / "clipped.npz", 4, 1.5, [0.45, 0.35, 0.2, 0.0], seed=71, rare=3, max_iterations=10),
    }
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "conformance" / "label_shift_refs.py")]
        + [str(root / f"{name}.npz") for name in made],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (case, answer) for (name, case), answer in zip(made.items(), answers)}


@pytest.mark.parametrize("name", ["shifted", "clipped"])
def test_em_equals_abstention_and_labelshift(cases, name):
    case, refs = cases[name]
    source = np.bincount(case["valid_labels"], minlength=case["valid_probs"].shape[1]) / len(case["valid_labels"])
    ours = em_priors(case["target_probs"], source, tolerance=TOLERANCE, max_iterations=int(case["max_iterations"]))
    np.testing.assert_allclose(ours.weights, refs["abstention"]["em_weights"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.priors, refs["labelshift"]["em_priors"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.weights, refs["labelshift"]["em_weights"], rtol=0, atol=1e-12)


def test_em_parity_holds_where_the_iterations_run_out(cases):
    """The weak model's window is still moving after 10 iterations: the three stop at the same iterate (the test
    above), which is not EM's fixed point."""
    case, _ = cases["clipped"]
    source = np.bincount(case["valid_labels"], minlength=4) / len(case["valid_labels"])
    ours = em_priors(case["target_probs"], source, tolerance=TOLERANCE, max_iterations=10)
    assert not ours.converged and ours.iterations == 10
    assert em_priors(case["target_probs"], source, tolerance=TOLERANCE).iterations > 10


@pytest.mark.parametrize("name", ["shifted", "clipped"])
def test_bbse_equals_labelshift_and_abstention_up_to_its_renormalisation(cases, name):
    case, refs = cases[name]
    confusion = confusion_counts(case["valid_probs"], case["valid_labels"])
    ours = bbse_priors(case["target_probs"], confusion)
    np.testing.assert_allclose(ours.priors, refs["labelshift"]["bbse_priors"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.weights, refs["labelshift"]["bbse_weights"], rtol=0, atol=1e-12)
    source = confusion.sum(axis=0) / confusion.sum()
    theirs = np.asarray(refs["abstention"]["bbse_weights"])
    clipped = theirs * source
    np.testing.assert_allclose(ours.weights, clipped / clipped.sum() / source, rtol=0, atol=1e-12)
    if name == "clipped":
        assert min(ours.weights) == 0.0 and abs(clipped.sum() - 1.0) > 1e-3  # abstention's priors sum past 1
    else:
        np.testing.assert_allclose(ours.weights, theirs, rtol=0, atol=1e-12)


def test_bcts_equals_abstentions_fit_within_the_stopping_rules(cases):
    case, refs = cases["shifted"]
    ours = BiasCorrectedTemperatureScaling().fit(case["logits"], case["labels"])
    z, y = case["logits"], case["labels"]
    q = ours.transform(z)

    def probabilities(fit):
        return softmax(z / fit["temperature"] + np.asarray(fit["biases"]))

    tight = refs["abstention"]["bcts_tight"]
    assert ours.temperature == pytest.approx(tight["temperature"], rel=1e-6)
    np.testing.assert_allclose(q, probabilities(tight), rtol=0, atol=1e-6)
    for fit, atol in ((refs["abstention"]["bcts"], 1e-4), (refs["labelshift"]["bcts"], 1e-3)):
        assert ours.temperature == pytest.approx(fit["temperature"], rel=atol)
        np.testing.assert_allclose(q, probabilities(fit), rtol=0, atol=atol)
        assert metrics.nll(q, y) <= metrics.nll(probabilities(fit), y) + 1e-12
