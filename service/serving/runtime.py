"""onnxruntime sessions with explicit providers, threads and graph optimisation.

The provider that really runs is read back from the session after creation: onnxruntime-gpu
advertises CUDA even on machines without a usable GPU and silently falls back to CPU, so what was
asked for is not what runs. Asking for CUDA where it cannot run logs a clear warning.

On CUDA a session runs through onnxruntime's I/O binding: the batch is bound where it lies in host
memory and the outputs are bound to host buffers that onnxruntime allocates, so each call makes one
copy each way and no intermediate copies (``IO_BINDING``; on the CPU provider it buys nothing, and
``session.run`` is used).

onnxruntime-gpu finds CUDA and cuDNN installed as pip packages (``nvidia-*``, as a CUDA build of torch
brings them) only after ``onnxruntime.preload_dlls()``; ``preload_cuda_libraries`` calls it once at
start-up whenever CUDA will be asked for.

Dynamic batching hands a session a new batch size at almost every call; on CUDA each new input shape
costs cuDNN an algorithm search and an execution plan for every convolution, far longer than the call.
With ``pad_batches`` a session pads each batch to the next of a few bucket sizes (``batch_buckets``),
all warmed up at load, and slices the outputs back. Padding alone is not enough: onnxruntime's CUDA
convolution keeps the cuDNN descriptors and plan of the last input shape only, so a session that alternates
between bucket sizes rebuilds them for every convolution at nearly every call. With ``bucket_sessions`` each
bucket size gets a session of its own, which meets one shape only.

CUDA's TF32 tensor cores round matmul and convolution inputs to a 10-bit mantissa, so probabilities
drift from the CPU path's by more than float32 rounding; ``cuda_tf32`` is off by default, so that a
served probability is the exported model's to float32 precision on either device.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import onnxruntime as ort

from service.settings import Settings

log = logging.getLogger("service.serving.runtime")

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
#: Every graph optimisation onnxruntime has, its own default: the investigations of the serving path never turned
#: one off (decision 0029 made this and the next two constants of what were settings).
GRAPH_OPTIMIZATION = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
#: Inter-op threads per session: only onnxruntime's parallel execution mode uses them, and the sessions run their
#: graph in its default sequential mode, so a second one would only wait.
INTER_OP_THREADS = 1
#: I/O binding, "on", "off" or "auto" (on for sessions that run on CUDA): there it saves the intermediate copies of
#: the batch and the outputs; on the CPU provider it buys nothing. Turning it off on the GPU changed nothing the
#: first GPU run could tell (decision 0001); the tests set it to check that both paths answer alike.
IO_BINDING: Literal["auto", "on", "off"] = "auto"


def nvidia_device_present() -> bool:
    """Whether the kernel exposes an NVIDIA GPU (the driver's device node or proc entry)."""
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def cuda_wanted(device: str) -> bool:
    """Whether CUDA will be asked for: ``device=cuda``, or ``auto`` with a CUDA build and an NVIDIA device."""
    cuda_built = CUDA in ort.get_available_providers()
    return cuda_built and (device == "cuda" or (device == "auto" and nvidia_device_present()))


_CUDA_LIBRARIES = (
    "libcudart.so",
    "libcublas.so",
    "libcublasLt.so",
    "libcudnn",
    "libcufft.so",
    "libcurand.so",
    "libnvJitLink.so",
    "libnvrtc.so",
)


def loaded_cuda_libraries(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """The CUDA and cuDNN shared libraries mapped into this process (their paths, from ``/proc/self/maps``)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    paths = {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}
    return sorted(p for p in paths if Path(p).name.startswith(_CUDA_LIBRARIES))


def preload_cuda_libraries(device: str) -> list[str] | None:
    """Load the CUDA and cuDNN libraries of pip's ``nvidia-*`` packages (``onnxruntime.preload_dlls()``,
    onnxruntime >= 1.21) when CUDA will be asked for; the libraries then loaded, or None when CUDA is not
    wanted. Never raises: a failure is logged and the CUDA provider reports later whether it could start."""
    if not cuda_wanted(device):
        return None
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        log.info(
            "onnxruntime %s has no preload_dlls(): CUDA libraries are found through LD_LIBRARY_PATH only",
            ort.__version__,
        )
    else:
        try:
            preload()
        except Exception as exc:  # noqa: BLE001 - a CPU start never fails over a GPU library
            log.warning("onnxruntime.preload_dlls() failed: %s", exc)
    libraries = loaded_cuda_libraries()
    log.info("CUDA libraries loaded: %s", ", ".join(libraries) or "none found (the CUDA provider may not start)")
    return libraries


def requested_providers(device: str) -> list[str]:
    """Providers to ask for: CUDA first when wanted and plausible, CPU always as the fallback."""
    if device == "cuda" and CUDA not in ort.get_available_providers():
        log.warning("device=cuda but this onnxruntime build has no CUDA provider (install onnxruntime-gpu); using CPU")
        return [CPU]
    if cuda_wanted(device):
        return [CUDA, CPU]
    return [CPU]


def provider_options(settings: Settings) -> list[str | tuple[str, dict[str, str]]]:
    """``requested_providers`` with the CUDA provider's options from the settings (TF32, cuDNN's
    convolution algorithm search), as ``InferenceSession(providers=...)`` takes them."""
    options = settings.runtime
    cuda = {"use_tf32": "1" if options.cuda_tf32 else "0", "cudnn_conv_algo_search": options.cuda_conv_algo_search}
    return [(p, cuda) if p == CUDA else p for p in requested_providers(settings.device)]


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes a padding session runs: the powers of two below ``max_batch_size``, and it."""
    return (*(2**k for k in range(max_batch_size.bit_length()) if 2**k < max_batch_size), max_batch_size)


class Runtime(Protocol):
    """What serving shows of a session: ``ModelRuntime``, or a front-end's ``service.engine.frontend.RemoteRuntime``
    for the engine's."""

    provider: str
    requested: list[str]
    output_names: list[str]
    io_binding: bool
    buckets: tuple[int, ...]
    bucket_sessions: dict

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]: ...


@dataclass
class ModelRuntime:
    """One onnxruntime session: its input/output names, the provider that actually runs it, and the batch
    sizes it pads to (``buckets``; none: every batch runs as it comes), each with a session of its own in
    ``bucket_sessions`` (none: ``session`` runs them all)."""

    session: ort.InferenceSession
    provider: str
    requested: list[str]
    input_name: str
    output_names: list[str]
    io_binding: bool = False
    buckets: tuple[int, ...] = ()
    bucket_sessions: dict[int, ort.InferenceSession] = field(default_factory=dict)

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs on a float32 batch (blocking; call it off the event loop). A batch smaller than a
        bucket is padded with zero rows up to the smallest such bucket, and the outputs cut back to its rows;
        a batch larger than every bucket runs as it is. Each bucket runs on its own session when it has one."""
        rows = len(x)
        size = next((b for b in self.buckets if b >= rows), rows)
        # a batch larger than every bucket goes to the largest bucket's session, off the single-row path
        session = self.bucket_sessions.get(min(size, self.buckets[-1]) if self.buckets else size, self.session)
        if size == rows:
            return self._run(session, x)
        padded = np.zeros((size, *x.shape[1:]), dtype=np.float32)
        padded[:rows] = x
        return {name: value[:rows] for name, value in self._run(session, padded).items()}

    def _run(self, session: ort.InferenceSession, x: np.ndarray) -> dict[str, np.ndarray]:
        if not self.io_binding:
            return dict(zip(self.output_names, session.run(self.output_names, {self.input_name: x})))
        binding = session.io_binding()
        binding.bind_cpu_input(self.input_name, np.ascontiguousarray(x))
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))


def create_runtime(
    path: Path, settings: Settings, sessions: int = 1, profile: Path | None = None, max_batch_size: int = 0
) -> ModelRuntime:
    """One of ``sessions`` sessions for ``path``, with the configured providers and intra-op threads (unless set,
    the machine's cores divided among the sessions). With ``max_batch_size`` and ``pad_batches`` on (auto: on CUDA),
    it pads batches to ``batch_buckets``, each bucket run by a session of its own with ``bucket_sessions`` on (auto:
    on CUDA). With ``profile``, onnxruntime's profiler traces every run to a JSON file of that prefix
    (``end_profiling``)."""
    options = ort.SessionOptions()
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    options.intra_op_num_threads = settings.runtime.intra_op_threads or max(1, (os.cpu_count() or 1) // sessions)
    options.inter_op_num_threads = INTER_OP_THREADS
    options.graph_optimization_level = GRAPH_OPTIMIZATION
    options.log_severity_level = 3
    # No busy-waiting between calls: spinning intra-op threads would take the cores the event loop,
    # HTTP parsing and the batcher need between onnxruntime calls.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    providers = provider_options(settings)
    requested = [p if isinstance(p, str) else p[0] for p in providers]
    session = ort.InferenceSession(str(path), options, providers=providers)
    provider = session.get_providers()[0]
    if requested[0] == CUDA and provider != CUDA:
        log.warning(
            "%s: CUDA was requested (device=%s) but onnxruntime could not use it; serving on %s",
            path,
            settings.device,
            provider,
        )

    def wanted(choice: Literal["auto", "on", "off"]) -> bool:
        """An ``auto``/``on``/``off`` choice for this session: ``auto`` is on where it runs on CUDA."""
        return choice == "on" or (choice == "auto" and provider == CUDA)

    io_binding = wanted(IO_BINDING)
    pads = max_batch_size > 0 and wanted(settings.runtime.pad_batches)
    buckets = batch_buckets(max_batch_size) if pads else ()
    own = bool(buckets) and wanted(settings.runtime.bucket_sessions)
    return ModelRuntime(
        session,
        provider,
        requested,
        session.get_inputs()[0].name,
        [o.name for o in session.get_outputs()],
        io_binding,
        buckets,
        {
            size: session if i == 0 else ort.InferenceSession(str(path), options, providers=providers)
            for i, size in enumerate(buckets)
        }
        if own
        else {},
    )
