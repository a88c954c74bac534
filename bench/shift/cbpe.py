"""NannyML's CBPE on the shift benchmark's windows, run in .venv-cbpe (nannyml does not install beside .venv's
pins); the benchmark writes the inputs and reads the output (``bench.shift.measure.cbpe_estimates``).

    .venv-cbpe/bin/python bench/shift/cbpe.py cases.npz out.json

``cases.npz`` holds, for each source s, ``reference_probs_s`` (N, K) and ``reference_labels_s`` (N,), the labelled
rows CBPE is fitted on; for each pool p, ``pool_probs_p`` (M, K); for each case c, ``case_c`` (windows, n), the rows
of its pool in each window, and ``meta_c`` = [s, p]. Writes ``{"nannyml": version, "estimates": [[accuracy of each
window] for each case]}``: CBPE's estimated accuracy (Kivimäki et al. 2024's confidence-based estimate after its own
per-class isotonic calibration on the reference), one chunk per window. Imports nothing of this project.
"""

import json
import sys
import warnings

import numpy as np
import pandas as pd

warnings.filterwarnings("ignore")


def frame(probs: np.ndarray, labels: np.ndarray | None) -> pd.DataFrame:
    data = {f"p{k}": probs[:, k] for k in range(probs.shape[1])}
    data["y_pred"] = probs.argmax(axis=1)
    if labels is not None:
        data["y_true"] = labels
    return pd.DataFrame(data)


def estimates(data, case: int) -> list[float]:
    """CBPE's accuracy per window of ``case``: fitted on its source's reference, one chunk of n rows per window."""
    import nannyml as nml

    index = data[f"case_{case}"]
    source, pool = (int(v) for v in data[f"meta_{case}"])
    reference_probs = data[f"reference_probs_{source}"]
    k = reference_probs.shape[1]
    estimator = nml.CBPE(
        problem_type="classification_multiclass",
        y_pred_proba={c: f"p{c}" for c in range(k)},
        y_pred="y_pred",
        y_true="y_true",
        metrics=["accuracy"],
        chunk_size=index.shape[1],
    )
    estimator.fit(frame(reference_probs, data[f"reference_labels_{source}"]))
    result = estimator.estimate(frame(data[f"pool_probs_{pool}"][index.ravel()], None))
    table = result.filter(period="analysis").to_df()
    values = table[("accuracy", "value")].to_numpy(dtype=np.float64)
    if len(values) != index.shape[0]:
        raise SystemExit(f"case {case}: {len(values)} chunks for {index.shape[0]} windows")
    return values.tolist()


def main() -> None:
    import nannyml

    data = np.load(sys.argv[1])
    cases = sorted(int(name.split("_")[1]) for name in data.files if name.startswith("case_"))
    out = {"nannyml": nannyml.__version__, "estimates": [estimates(data, c) for c in cases]}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
