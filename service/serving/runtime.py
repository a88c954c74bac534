"""onnxruntime sessions with explicit providers, threads and graph optimisation.

The provider that really runs is read back from the session after creation: onnxruntime-gpu
advertises CUDA even on machines without a usable GPU and silently falls back to CPU, so what was
asked for is not what runs. Asking for CUDA where it cannot run logs a clear warning.

On CUDA a session runs through onnxruntime's I/O binding: the batch is bound where it lies in host
memory and the outputs are bound to host buffers that onnxruntime allocates, so each call makes one
copy each way and no intermediate copies (``io_binding`` in the settings; on the CPU provider it buys
nothing, and ``session.run`` is used).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.settings import Settings

log = logging.getLogger("service.serving.runtime")

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def nvidia_device_present() -> bool:
    """Whether the kernel exposes an NVIDIA GPU (the driver's device node or proc entry)."""
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def requested_providers(device: str) -> list[str]:
    """Providers to ask for: CUDA first when wanted and plausible, CPU always as the fallback."""
    cuda_built = CUDA in ort.get_available_providers()
    if device == "cuda" and not cuda_built:
        log.warning("device=cuda but this onnxruntime build has no CUDA provider (install onnxruntime-gpu); using CPU")
        return [CPU]
    if device == "cuda" or (device == "auto" and cuda_built and nvidia_device_present()):
        return [CUDA, CPU]
    return [CPU]


@dataclass
class ModelRuntime:
    """One onnxruntime session: its input/output names and the provider that actually runs it."""

    session: ort.InferenceSession
    provider: str
    requested: list[str]
    input_name: str
    output_names: list[str]
    io_binding: bool = False

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs on a float32 batch (blocking; call it off the event loop)."""
        if not self.io_binding:
            return dict(zip(self.output_names, self.session.run(self.output_names, {self.input_name: x})))
        binding = self.session.io_binding()
        binding.bind_cpu_input(self.input_name, np.ascontiguousarray(x))
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))


def create_runtime(path: Path, settings: Settings, sessions: int = 1) -> ModelRuntime:
    """One of ``sessions`` sessions for ``path``, with the configured providers, threads and optimisation
    level; unless set, the intra-op threads are the machine's cores divided among the sessions."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads or max(1, (os.cpu_count() or 1) // sessions)
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _OPTIMIZATION[settings.graph_optimization]
    options.log_severity_level = 3
    # No busy-waiting between calls: spinning intra-op threads would take the cores the event loop,
    # HTTP parsing and the batcher need between onnxruntime calls.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    requested = requested_providers(settings.device)
    session = ort.InferenceSession(str(path), options, providers=requested)
    provider = session.get_providers()[0]
    if requested[0] == CUDA and provider != CUDA:
        log.warning("%s: CUDA was requested (device=%s) but onnxruntime could not use it; serving on %s",
                    path, settings.device, provider)
    io_binding = settings.io_binding == "on" or (settings.io_binding == "auto" and provider == CUDA)
    return ModelRuntime(session, provider, requested, session.get_inputs()[0].name,
                        [o.name for o in session.get_outputs()], io_binding)
