"""The buckets of a padding runtime (``service.serving.runtime``): per batch size its session, a zero-padded host
staging buffer and, with I/O binding, device buffers bound once (the addresses a CUDA graph replays on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

#: numpy types of the ONNX output types a bound output buffer is allocated with (others: float32).
_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def fixed_shape(dims: Sequence) -> tuple[int, ...] | None:
    """``dims`` when every dimension is a number, None when one is named or unknown."""
    return tuple(dims) if all(isinstance(d, int) for d in dims) else None


class Bucket:
    """The batches up to ``size`` rows, padded from ``staging``; ``device`` binds the input and outputs once there."""

    def __init__(
        self,
        size: int,
        session: ort.InferenceSession,
        input_name: str,
        output_names: list[str],
        device: str | None = None,
        graph: bool = False,
    ):
        self.size, self.session, self.input_name, self.output_names = size, session, input_name, output_names
        self.device, self.graph = device, graph
        self.staging: np.ndarray | None = None
        self.filled = 0  # rows of ``staging`` that the last batch wrote; the rows after them are zero
        self.binding: ort.IOBinding | None = None
        self.input_value: ort.OrtValue | None = None
        self.output_values: list[ort.OrtValue] = []
        self.bound_bytes = 0

    @property
    def nbytes(self) -> int:
        """Host staging and bound device buffers, in bytes."""
        return (0 if self.staging is None else self.staging.nbytes) + self.bound_bytes

    def allocate(self, row_shape: tuple[int, ...]) -> None:
        """The staging buffer for rows of ``row_shape``, zeroed, and with a ``device`` the bound buffers."""
        if self.graph and self.staging is not None:
            raise ValueError(
                f"rows of shape {row_shape} for a CUDA graph captured on rows of shape {self.staging.shape[1:]}"
            )
        self.staging = np.zeros((self.size, *row_shape), dtype=np.float32)
        self.filled = 0
        if self.device is None:
            return
        outputs = self._outputs()
        self.input_value = ort.OrtValue.ortvalue_from_shape_and_type(self.staging.shape, np.float32, self.device, 0)
        self.output_values = [
            ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device, 0) for shape, dtype in outputs
        ]
        self.bound_bytes = self.staging.nbytes + sum(
            math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in outputs
        )
        binding = self.session.io_binding()
        binding.bind_ortvalue_input(self.input_name, self.input_value)
        for name, value in zip(self.output_names, self.output_values):
            binding.bind_ortvalue_output(name, value)
        self.binding = binding

    def _outputs(self) -> list[tuple[tuple[int, ...], type]]:
        """(shape, numpy type) of each output on ``size`` rows: the graph's declared ones, else one run's (never on a
        graph session: its first runs capture)."""
        declared = {o.name: o for o in self.session.get_outputs()}
        rows = [fixed_shape(declared[name].shape[1:]) for name in self.output_names]
        if all(shape is not None for shape in rows):
            return [
                ((self.size, *shape), _NUMPY_TYPES.get(declared[name].type, np.float32))
                for name, shape in zip(self.output_names, rows)
                if shape is not None
            ]
        if self.graph:
            raise ValueError("the graph's outputs have no fixed shape")
        probe = self.session.run(self.output_names, {self.input_name: self.staging})
        return [(value.shape, value.dtype.type) for value in probe]

    def stage(self, parts: Sequence[np.ndarray], rows: int) -> None:
        """Copy ``parts`` (``rows`` rows) into the staging buffer and zero what the last batch left beyond them."""
        row_shape = parts[0].shape[1:]
        if self.staging is None or self.staging.shape[1:] != row_shape:
            self.allocate(row_shape)
        staging = self.staging
        assert staging is not None
        start = 0
        for part in parts:
            if part.shape[1:] != row_shape:
                raise ValueError(f"a batch mixes rows of shapes {row_shape} and {part.shape[1:]}")
            staging[start : start + len(part)] = part
            start += len(part)
        if self.filled > rows:
            staging[rows : self.filled] = 0
        self.filled = rows

    def run(self, parts: Sequence[np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Every output on ``parts`` (``rows`` rows), run padded to ``size`` rows; the arrays are the caller's."""
        self.stage(parts, rows)
        if self.binding is None:
            outputs = self.session.run(self.output_names, {self.input_name: self.staging})
        else:
            assert self.input_value is not None
            self.input_value.update_inplace(self.staging)
            self.session.run_with_iobinding(self.binding)
            outputs = self.binding.copy_outputs_to_cpu()
        return {name: value[:rows] for name, value in zip(self.output_names, outputs)}

    def capture(self, plain: ort.InferenceSession, tolerance: float = 1e-3) -> None:
        """Capture the CUDA graph (two runs on zero rows: the allocations and the capture) and check two replays on
        random rows against ``plain``, a session without a graph; a replay that ignores the updated rows raises."""
        assert self.staging is not None
        zeros = np.zeros_like(self.staging)
        self.run([zeros], self.size)
        self.run([zeros], self.size)
        rng = np.random.default_rng(0)
        for _ in range(2):
            rows = rng.standard_normal(self.staging.shape).astype(np.float32)
            replayed = self.run([rows], self.size)
            expected = dict(zip(self.output_names, plain.run(self.output_names, {self.input_name: rows})))
            for name in self.output_names:
                if not np.allclose(replayed[name], expected[name], rtol=tolerance, atol=tolerance):
                    raise RuntimeError(f"the replayed graph's {name!r} differs from a run without a graph")
