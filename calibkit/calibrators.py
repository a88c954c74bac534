"""Post-hoc calibrators behind one small interface: fit / transform / to_dict / from_dict.

Every calibrator maps logits to calibrated probabilities. Logits are (N, K), or (N,) for a
single-logit binary model (then probabilities come back as (N,) too). For a model that only
outputs probabilities, pass log-probabilities: softmax(log p) = p.
Parameters are plain floats, so each calibrator saves to and loads from JSON, and applying
one needs only numpy (fitting isotonic regression needs scikit-learn).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np
from scipy import optimize, special

from calibkit import binning
from calibkit.temperature import T_MAX, T_MIN, apply_temperature, fit_temperature, softmax
from calibkit.validation import check_int, check_logits, check_logits_labels, check_n_bins, expected


class Calibrator(ABC):
    """Base class: shape handling, the fitted check and (de)serialisation."""

    method: ClassVar[str]
    n_classes: int | None = None

    def fit(self, logits, labels) -> Calibrator:
        """Fit on held-out (validation) logits (N, K), or (N,) for a single-logit binary model, and labels (N,);
        returns the calibrator itself."""
        z, y = check_logits_labels(logits, labels)
        self.n_classes = 2 if z.ndim == 1 else z.shape[1]
        self._fit(z, y)
        return self

    def transform(self, logits) -> np.ndarray:
        """Calibrated probabilities (N, K) for new logits of the width the calibrator was fitted on, or (N,)
        positive-class probabilities for (N,) logits."""
        if self.n_classes is None:
            raise ValueError(f"{type(self).__name__} is not fitted yet: call fit() or load parameters first")
        z = check_logits(logits)
        width = 2 if z.ndim == 1 else z.shape[1]
        if width != self.n_classes:
            raise ValueError(f"logits have {width} classes but the calibrator was fitted on {self.n_classes}")
        return self._transform(z)

    def to_dict(self) -> dict:
        """The fitted calibrator as ``{"method": ..., "n_classes": K, "params": {...}}``, plain floats as parameters."""
        if self.n_classes is None:
            raise ValueError(f"{type(self).__name__} is not fitted yet: nothing to save")
        return {"method": self.method, "n_classes": self.n_classes, "params": self._params()}

    @classmethod
    def from_dict(cls, data: dict) -> Calibrator:
        """Rebuild a fitted calibrator from ``to_dict`` output; a ValueError names the field at fault."""
        if not isinstance(data, dict) or not {"method", "n_classes", "params"} <= data.keys():
            shown = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(expected("data", "an object with 'method', 'n_classes' and 'params'", shown))
        if data["method"] != cls.method:
            raise ValueError(expected("method", repr(cls.method), data["method"]))
        obj = cls()
        obj.n_classes = check_int("n_classes", data["n_classes"], 2)
        try:
            obj._load(data["params"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{cls.method} params are malformed: {exc!r}") from None
        return obj

    @abstractmethod
    def _fit(self, z: np.ndarray, y: np.ndarray) -> None: ...

    @abstractmethod
    def _transform(self, z: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _params(self) -> dict: ...

    @abstractmethod
    def _load(self, params: dict) -> None: ...


#: L-BFGS-B's stopping rules for BCTS: the relative decrease of the NLL and the largest projected gradient entry.
BCTS_FTOL, BCTS_GTOL, BCTS_MAXITER = 1e-14, 1e-9, 1000


def _two_columns(z: np.ndarray) -> np.ndarray:
    """A single binary logit z as the logit pair [0, z] (softmax of which is [1 - sigmoid(z), sigmoid(z)])."""
    return np.stack([np.zeros_like(z), z], axis=1) if z.ndim == 1 else z


def _like_input(q: np.ndarray, z: np.ndarray) -> np.ndarray:
    return q[:, 1] if z.ndim == 1 else q


def _finite_vector(name: str, values, length: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (length,) or not np.all(np.isfinite(arr)):
        raise ValueError(expected(name, f"{length} finite numbers", arr.tolist()))
    return arr


def _temperature(params: dict) -> float:
    t = float(params["temperature"])
    if not np.isfinite(t) or t <= 0:
        raise ValueError(expected("temperature", "a positive finite number", t))
    return t


class TemperatureScaling(Calibrator):
    """Temperature scaling: one scalar T > 0 divides every logit, q = softmax(z / T).

    See ``calibkit.temperature``; ``objective`` is ``"nll"`` or ``"ece"`` as in :func:`fit_temperature`.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.2.
    """

    method = "temperature"

    def __init__(self, objective: str = "nll", temperature: float = 1.0):
        self.objective = objective
        self.temperature = temperature

    def _fit(self, z, y):
        self.temperature = fit_temperature(z, y, objective=self.objective)

    def _transform(self, z):
        return apply_temperature(z, self.temperature)

    def _params(self):
        return {"temperature": self.temperature}

    def _load(self, params):
        self.temperature = _temperature(params)


def _nll_and_grad(scaled: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean NLL of softmax(scaled) and its gradient with respect to ``scaled``."""
    log_q = special.log_softmax(scaled, axis=1)
    grad = np.exp(log_q)
    grad[np.arange(len(y)), y] -= 1.0
    return float(-np.mean(log_q[np.arange(len(y)), y])), grad / len(y)


class VectorScaling(Calibrator):
    """Vector scaling: q = softmax(w * z + b) with per-class w, b in R^K, fitted by NLL.

    References:
        Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.2.
    """

    method = "vector"

    def __init__(self) -> None:
        self.w: np.ndarray | None = None
        self.b: np.ndarray | None = None

    def _fit(self, z, y):
        z = _two_columns(z)
        k = z.shape[1]

        def objective(theta):
            loss, g = _nll_and_grad(theta[:k] * z + theta[k:], y)
            return loss, np.concatenate([(g * z).sum(axis=0), g.sum(axis=0)])

        theta0 = np.concatenate([np.ones(k), np.zeros(k)])
        result = optimize.minimize(objective, theta0, jac=True, method="L-BFGS-B")
        self.w, self.b = result.x[:k], result.x[k:]

    def _transform(self, z):
        return _like_input(softmax(self.w * _two_columns(z) + self.b), z)

    def _params(self):
        return {"w": self.w.tolist(), "b": self.b.tolist()}

    def _load(self, params):
        self.w = _finite_vector("w", params["w"], self.n_classes)
        self.b = _finite_vector("b", params["b"], self.n_classes)


class BiasCorrectedTemperatureScaling(Calibrator):
    """Bias-corrected temperature scaling (BCTS): q = softmax(z / T + b), one T > 0 and a bias b_k per class.

    Temperature scaling plus a per-class bias, fitted by NLL: in between temperature (b = 0) and vector scaling
    (one weight per class). The biases correct systematic errors in the class priors that temperature scaling
    leaves, which makes the probabilities fit for EM estimation of new class priors under label shift. Fitted over
    (beta, b) with beta = 1 / T, where z beta + b is linear in the parameters, so the NLL is convex and L-BFGS-B
    (gradient exact, beta kept in [1 / T_MAX, 1 / T_MIN], from T = 1, b = 0) finds its minimum. Adding a constant
    to every b_k leaves q unchanged; b is stored with mean 0. It is vector scaling with every w_k = 1 / T, which is
    how the ONNX export bakes it.

    References:
        Alexandari, Kundaje & Shrikumar 2020, "Maximum Likelihood with Bias-Corrected Calibration is Hard-To-Beat at
        Label Shift Adaptation", ICML; Guo et al. 2017 (temperature and vector scaling).
    """

    method = "bcts"

    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature
        self.b: np.ndarray | None = None

    def _fit(self, z, y):
        z = _two_columns(z)
        k = z.shape[1]

        def objective(theta):
            loss, g = _nll_and_grad(theta[0] * z + theta[1:], y)
            return loss, np.concatenate([[(g * z).sum()], g.sum(axis=0)])

        theta0 = np.concatenate([[1.0], np.zeros(k)])
        bounds = [(1.0 / T_MAX, 1.0 / T_MIN)] + [(None, None)] * k
        options = {"maxiter": BCTS_MAXITER, "ftol": BCTS_FTOL, "gtol": BCTS_GTOL}
        result = optimize.minimize(objective, theta0, jac=True, method="L-BFGS-B", bounds=bounds, options=options)
        self.temperature = float(1.0 / result.x[0])
        self.b = result.x[1:] - result.x[1:].mean()

    def _transform(self, z):
        return _like_input(softmax(_two_columns(z) / self.temperature + self.b), z)

    def _params(self):
        return {"temperature": self.temperature, "b": self.b.tolist()}

    def _load(self, params):
        self.temperature = _temperature(params)
        self.b = _finite_vector("b", params["b"], self.n_classes)


class PlattScaling(Calibrator):
    """Platt scaling, for binary problems only: q = sigmoid(a * s + b), a and b fitted by NLL.

    s is the logit margin z_1 - z_0, or the single logit of a one-logit model.

    References:
        Platt 1999, "Probabilistic Outputs for Support Vector Machines and Comparisons to Regularized Likelihood
        Methods"; Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.1.
    """

    method = "platt"

    def __init__(self) -> None:
        self.a: float | None = None
        self.b: float | None = None

    @staticmethod
    def _margin(z: np.ndarray) -> np.ndarray:
        if z.ndim == 2 and z.shape[1] != 2:
            raise ValueError(
                f"Platt scaling is for binary problems, got {z.shape[1]} classes; use temperature or vector scaling"
            )
        return z if z.ndim == 1 else z[:, 1] - z[:, 0]

    def _fit(self, z, y):
        s = self._margin(z)

        def objective(theta):
            loss, g = _nll_and_grad(np.stack([np.zeros_like(s), theta[0] * s + theta[1]], axis=1), y)
            return loss, np.array([(g[:, 1] * s).sum(), g[:, 1].sum()])

        result = optimize.minimize(objective, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B")
        self.a, self.b = float(result.x[0]), float(result.x[1])

    def _transform(self, z):
        q = special.expit(self.a * self._margin(z) + self.b)
        return q if z.ndim == 1 else np.stack([1.0 - q, q], axis=1)

    def _params(self):
        return {"a": self.a, "b": self.b}

    def _load(self, params):
        if self.n_classes != 2:
            raise ValueError(expected("n_classes", "2 (Platt scaling is for binary problems)", self.n_classes))
        self.a, self.b = (float(v) for v in _finite_vector("a, b", [params["a"], params["b"]], 2))


def _normalise(q: np.ndarray) -> np.ndarray:
    """Rows scaled to sum to 1; a row with no mass left becomes uniform."""
    total = q.sum(axis=1, keepdims=True)
    return np.where(total > 0, q / np.where(total > 0, total, 1.0), 1.0 / q.shape[1])


class HistogramBinning(Calibrator):
    """One-vs-rest histogram binning: each class probability replaced by its bin's frequency, renormalised.

    For each class k, p_k = softmax(z)_k falls in one of M equal-width bins and is replaced by theta_mk, the
    frequency of class k among the validation samples in that bin (the bin midpoint where the bin was empty);
    rows are then renormalised to sum to 1.

    References:
        Zadrozny & Elkan 2001, "Obtaining calibrated probability estimates from decision trees and naive Bayesian
        classifiers"; Guo et al. 2017, "On Calibration of Modern Neural Networks", Sec. 4.1 and 4.2 (multiclass).
    """

    method = "histogram"

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(n_bins)
        self.theta: np.ndarray | None = None

    def _fit(self, z, y):
        p = softmax(_two_columns(z))
        edges = binning.equal_width_edges(self.n_bins)
        sums = binning.classwise_bin_sums(p, y, edges)
        midpoints = (edges[:-1] + edges[1:]) / 2.0
        with np.errstate(invalid="ignore", divide="ignore"):
            self.theta = np.where(sums.count > 0, sums.outcome_sum / sums.count, midpoints)

    def _transform(self, z):
        p = softmax(_two_columns(z))
        idx = binning.bin_index(p, binning.equal_width_edges(self.n_bins))
        q = np.take_along_axis(self.theta, idx.T, axis=1).T
        return _like_input(_normalise(q), z)

    def _params(self):
        return {"n_bins": self.n_bins, "theta": self.theta.tolist()}

    def _load(self, params):
        self.n_bins = check_n_bins(params["n_bins"])
        theta = np.asarray(params["theta"], dtype=np.float64)
        if theta.shape != (self.n_classes, self.n_bins) or not np.all((theta >= 0) & (theta <= 1)):
            raise ValueError(
                f"Expected `theta` to be a {self.n_classes} x {self.n_bins} matrix of values in [0, 1], but got "
                f"shape {theta.shape} with values in [{theta.min(initial=0.0):g}, {theta.max(initial=0.0):g}]"
            )
        self.theta = theta


class IsotonicCalibration(Calibrator):
    """One-vs-rest isotonic regression of 1[y = k] on p_k, renormalised.

    Fitted with scikit-learn's IsotonicRegression; stored as its breakpoints and applied with linear
    interpolation (np.interp), which is exactly what IsotonicRegression.predict does.

    References:
        Zadrozny & Elkan 2002, "Transforming classifier scores into accurate multiclass probability estimates".
    """

    method = "isotonic"

    def __init__(self) -> None:
        self.x: list[np.ndarray] | None = None
        self.y: list[np.ndarray] | None = None

    def _fit(self, z, y):
        from sklearn.isotonic import IsotonicRegression

        p = softmax(_two_columns(z))
        self.x, self.y = [], []
        for k in range(p.shape[1]):
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p[:, k], (y == k).astype(float))
            self.x.append(np.asarray(iso.X_thresholds_, dtype=np.float64))
            self.y.append(np.asarray(iso.y_thresholds_, dtype=np.float64))

    def _transform(self, z):
        p = softmax(_two_columns(z))
        q = np.stack([np.interp(p[:, k], self.x[k], self.y[k]) for k in range(p.shape[1])], axis=1)
        return _like_input(_normalise(q), z)

    def _params(self):
        return {"x": [a.tolist() for a in self.x], "y": [a.tolist() for a in self.y]}

    def _load(self, params):
        xs, ys = params["x"], params["y"]
        if len(xs) != self.n_classes or len(ys) != self.n_classes:
            raise ValueError(
                f"Expected `x` and `y` to hold one breakpoint list per class ({self.n_classes}), but got "
                f"{len(xs)} and {len(ys)}"
            )
        self.x, self.y = [], []
        for k, (xk, yk) in enumerate(zip(xs, ys)):
            xk, yk = np.asarray(xk, dtype=np.float64), np.asarray(yk, dtype=np.float64)
            if xk.ndim != 1 or xk.shape != yk.shape or len(xk) == 0 or np.any(np.diff(xk) < 0):
                order = "unsorted" if xk.ndim == 1 and np.any(np.diff(xk) < 0) else "sorted"
                raise ValueError(
                    f"Expected `x[{k}]` and `y[{k}]` to be non-empty breakpoints of one length, `x[{k}]` sorted, but "
                    f"got shapes {xk.shape} and {yk.shape}, `x[{k}]` {order}"
                )
            self.x.append(xk)
            self.y.append(yk)


CALIBRATORS: dict[str, type[Calibrator]] = {
    cls.method: cls
    for cls in (
        TemperatureScaling,
        VectorScaling,
        BiasCorrectedTemperatureScaling,
        PlattScaling,
        HistogramBinning,
        IsotonicCalibration,
    )
}


def _calibrator_class(method) -> type[Calibrator]:
    if method not in CALIBRATORS:
        raise ValueError(f"unknown calibration method {method!r}; known: {', '.join(CALIBRATORS)}")
    return CALIBRATORS[method]


def build_calibrator(method: str, **options) -> Calibrator:
    """An unfitted calibrator by name (``temperature``, ``vector``, ``bcts``, ``platt``, ``histogram`` or
    ``isotonic``) with its own options, e.g. ``objective`` for temperature, ``n_bins`` for histogram."""
    return _calibrator_class(method)(**options)


def calibrator_from_dict(data: dict) -> Calibrator:
    """Rebuild any fitted calibrator from its ``to_dict`` output."""
    return _calibrator_class(data.get("method") if isinstance(data, dict) else None).from_dict(data)


def save_calibrator(calibrator: Calibrator, path: str | Path) -> None:
    """Write ``calibrator.to_dict()`` of a fitted calibrator to a JSON file."""
    Path(path).write_text(json.dumps(calibrator.to_dict(), indent=2))


def load_calibrator(path: str | Path) -> Calibrator:
    """Read a calibrator written by :func:`save_calibrator`."""
    return calibrator_from_dict(json.loads(Path(path).read_text()))
