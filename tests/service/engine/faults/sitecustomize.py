"""Fault injection for the pod's tests, loaded by Python at start-up from ``PYTHONPATH``: in the engine process only,
an onnxruntime call fails as a GPU fails once the file ``POD_TEST_FAULT`` names holds ``sticky`` (a sticky CUDA
error) or ``stuck`` (a call that never returns). The file is removed as the fault fires, so that the engine the pod
starts next serves as usual."""

import os
import time
from pathlib import Path

_FAULT = os.environ.get("POD_TEST_FAULT")
if _FAULT and b"service.engine" in Path("/proc/self/cmdline").read_bytes():
    import onnxruntime

    def _faulty(call):
        def run(self, *args, **kwargs):
            path = Path(_FAULT)
            if path.exists():
                kind = path.read_text().strip()
                path.unlink()
                if kind == "sticky":
                    raise RuntimeError(
                        "[ONNXRuntimeError] : 1 : FAIL : CUDA failure 700: an illegal memory access was encountered"
                    )
                time.sleep(3600)
            return call(self, *args, **kwargs)

        return run

    onnxruntime.InferenceSession.run = _faulty(onnxruntime.InferenceSession.run)
    onnxruntime.InferenceSession.run_with_iobinding = _faulty(onnxruntime.InferenceSession.run_with_iobinding)
