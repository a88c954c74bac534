"""onnxruntime sessions with explicit providers, threads and graph optimisation; the provider that runs is read back
from the session, as onnxruntime-gpu advertises CUDA even where it falls back to the CPU.

On CUDA each new input shape costs cuDNN an algorithm search, so ``pad_batches`` pads a batch to a bucket size
(``service.serving.buckets``), on a session of its own with ``bucket_sessions``, replaying a CUDA graph with
``cuda_graphs``. ``cuda_tf32`` is off by default: TF32 would change a served probability from the exported model's.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import onnxruntime as ort

from service.serving.buckets import Bucket, fixed_shape
from service.settings import Settings

log = logging.getLogger("service.serving.runtime")

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
#: Every graph optimisation onnxruntime has, its own default (decision 0029: this and the next two were settings).
GRAPH_OPTIMIZATION = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
#: Inter-op threads per session: only the parallel execution mode uses them, and the sessions run sequentially.
INTER_OP_THREADS = 1
#: I/O binding ("auto": on CUDA, where it saves onnxruntime's copies; decision 0001); the tests set both paths.
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
    """Load pip's CUDA and cuDNN libraries (``onnxruntime.preload_dlls()``, onnxruntime >= 1.21) when CUDA will be
    asked for; the libraries then loaded, or None. Never raises: the CUDA provider reports later whether it started."""
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
    """``requested_providers`` with the CUDA provider's options (TF32, cuDNN's algorithm search) from the settings."""
    options = settings.runtime
    cuda = {"use_tf32": "1" if options.cuda_tf32 else "0", "cudnn_conv_algo_search": options.cuda_conv_algo_search}
    return [(p, cuda) if p == CUDA else p for p in requested_providers(settings.device)]


def batch_buckets(max_batch_size: int, step: int = 0) -> tuple[int, ...]:
    """The batch sizes a padding runtime runs: the powers of two up to ``step``, then every ``step`` rows, then
    ``max_batch_size``; with ``step`` 0, the powers of two below ``max_batch_size``, then it."""
    powers = (2**k for k in range(max_batch_size.bit_length()) if 2**k < max_batch_size and (not step or 2**k <= step))
    steps = range(step, max_batch_size, step) if step else range(0)
    return tuple(sorted({*powers, *steps, max_batch_size}))


def ortvalue_device(provider: str) -> str:
    """Where a session's bound buffers lie: ``cuda`` for a session on CUDA, else ``cpu``."""
    return "cuda" if provider == CUDA else "cpu"


def _new_session(path: Path, options: ort.SessionOptions, providers: list) -> ort.InferenceSession:
    """An onnxruntime session of the model at ``path`` (every session of a runtime is made here)."""
    return ort.InferenceSession(str(path), options, providers=providers)


def _with_cuda_graphs(providers: list) -> list:
    """``providers`` with the CUDA provider's ``enable_cuda_graph`` on."""
    return [
        (p[0], {**p[1], "enable_cuda_graph": "1"}) if isinstance(p, tuple) and p[0] == CUDA else p for p in providers
    ]


class Runtime(Protocol):
    """What serving shows of a session: ``ModelRuntime``, or a front-end's ``RemoteRuntime``."""

    provider: str
    requested: list[str]
    output_names: list[str]
    io_binding: bool
    buckets: tuple[int, ...]
    bucket_sessions: dict
    cuda_graphs: bool
    graph_fallback: str
    warmup_seconds: float

    @property
    def staging_bytes(self) -> int: ...

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]: ...


@dataclass
class ModelRuntime:
    """One instance of a model in onnxruntime: its names, provider and the batch sizes it pads to (``buckets``), each on
    its own session in ``bucket_sessions`` (none: on ``session``). One inference thread calls it at a time."""

    session: ort.InferenceSession
    provider: str
    requested: list[str]
    input_name: str
    output_names: list[str]
    io_binding: bool = False
    buckets: tuple[int, ...] = ()
    bucket_sessions: dict[int, ort.InferenceSession] = field(default_factory=dict)
    bucket_runs: list[Bucket] = field(default_factory=list, repr=False)
    cuda_graphs: bool = False
    graph_fallback: str = ""
    warmup_seconds: float = 0.0
    graph_thread: ThreadPoolExecutor | None = field(default=None, repr=False)

    @property
    def staging_bytes(self) -> int:
        return sum(bucket.nbytes for bucket in self.bucket_runs)

    def run(self, x: np.ndarray | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """All outputs on a float32 batch (an array, or a batch's requests' arrays as if concatenated), padded in the
        smallest bucket that holds it, else run on ``session`` as it is. Blocking; the arrays are the caller's."""
        parts = [x] if isinstance(x, np.ndarray) else list(x)
        if not parts:
            raise ValueError("a batch needs at least one array of rows")
        rows = sum(len(part) for part in parts)
        index = bisect.bisect_left(self.buckets, rows)
        if index == len(self.buckets):
            return self._run(self.session, parts[0] if len(parts) == 1 else np.concatenate(parts))
        bucket = self.bucket_runs[index]
        if bucket.graph and self.graph_thread is not None:
            return self.graph_thread.submit(bucket.run, parts, rows).result()
        return bucket.run(parts, rows)

    def _run(self, session: ort.InferenceSession, x: np.ndarray) -> dict[str, np.ndarray]:
        """A batch as it comes, with an I/O binding made for the call."""
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
    """One of ``sessions`` sessions for ``path`` as configured (``auto``: on CUDA); ``profile`` traces every run."""
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
    session = _new_session(path, options, providers)
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

    pads = max_batch_size > 0 and wanted(settings.runtime.pad_batches)
    runtime = ModelRuntime(
        session,
        provider,
        requested,
        session.get_inputs()[0].name,
        [o.name for o in session.get_outputs()],
        wanted(IO_BINDING),
        batch_buckets(max_batch_size, settings.runtime.bucket_step) if pads else (),
    )
    own = bool(runtime.buckets) and wanted(settings.runtime.bucket_sessions)
    graphs = settings.runtime.cuda_graphs
    runtime.graph_fallback = _graph_obstacle(runtime, own) if graphs else ""
    if graphs and not runtime.graph_fallback:
        _capture_graphs(runtime, path, options, providers)
    if runtime.buckets and not runtime.cuda_graphs:
        runtime.bucket_runs = _buckets(runtime, path, options, providers, own)
    runtime.bucket_sessions = {b.size: b.session for b in runtime.bucket_runs} if own else {}
    return runtime


def _graph_obstacle(runtime: ModelRuntime, own: bool) -> str:
    """Why a runtime cannot run CUDA graphs, or "" when it can try."""
    if runtime.provider != CUDA:
        return f"the sessions run on {runtime.provider}, not CUDA"
    if not own:
        return "CUDA graphs need padding and bucket sessions (pad_batches, bucket_sessions)"
    if not runtime.io_binding:
        return "CUDA graphs need I/O binding"
    if fixed_shape(runtime.session.get_inputs()[0].shape[1:]) is None:
        return "the model's input rows have no fixed shape"
    return ""


def _buckets(
    runtime: ModelRuntime, path: Path, options: ort.SessionOptions, providers: list, own: bool, graph: bool = False
) -> list[Bucket]:
    """A bucket for each of ``runtime.buckets``, on a session of its own (``own``; capturing a CUDA graph with
    ``graph``) or on ``runtime.session``; allocated now when the rows have a fixed shape, else at its first batch."""
    device = ortvalue_device(runtime.provider) if runtime.io_binding else None
    row_shape = fixed_shape(runtime.session.get_inputs()[0].shape[1:])
    made = []
    for size in runtime.buckets:
        session = _new_session(path, options, _with_cuda_graphs(providers) if graph else providers) if own else None
        bucket = Bucket(size, session or runtime.session, runtime.input_name, runtime.output_names, device, graph)
        if row_shape is not None:
            bucket.allocate(row_shape)
        made.append(bucket)
    return made


def _capture_graphs(runtime: ModelRuntime, path: Path, options: ort.SessionOptions, providers: list) -> None:
    """Bucket sessions that each capture a CUDA graph, captured and checked on the thread that replays them; none
    when one fails (``graph_fallback`` says why)."""
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuda-graphs")
    started = time.perf_counter()
    size = 0
    try:
        buckets = _buckets(runtime, path, options, providers, own=True, graph=True)
        for bucket in buckets:
            size = bucket.size
            thread.submit(bucket.capture, runtime.session).result()
    except Exception as exc:  # noqa: BLE001 - any failure falls back to sessions without graphs
        thread.shutdown(wait=False)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f"capturing the {size}-row bucket" if size else "creating a bucket session"
        runtime.graph_fallback = f"CUDA graphs failed {where}: {first_line}"
        log.warning("%s: %s; serving without CUDA graphs", path, runtime.graph_fallback)
    else:
        runtime.bucket_runs, runtime.graph_thread, runtime.cuda_graphs = buckets, thread, True
    runtime.warmup_seconds += time.perf_counter() - started
