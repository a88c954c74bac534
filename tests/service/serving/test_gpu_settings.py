"""Serving on CUDA: the CUDA libraries of pip's nvidia-* packages are preloaded at start-up exactly when CUDA will
be asked for (a fake onnxruntime module stands in for the GPU build; a CPU start never fails over them), and the
CUDA provider options."""

import logging
import types

import pytest

from service.serving import runtime
from service.serving.repository import ModelRepository
from service.serving.runtime import CPU, CUDA, loaded_cuda_libraries, preload_cuda_libraries, provider_options
from service.settings import Settings

LIBRARIES = ["/site/nvidia/cu13/lib/libcudart.so.13", "/site/nvidia/cudnn/lib/libcudnn.so.9"]


class FakeOnnxruntime:
    """What ``preload_cuda_libraries`` uses of onnxruntime: its providers and ``preload_dlls``."""

    __version__ = "1.31.1"

    def __init__(self, providers, error: Exception | None = None):
        self.providers, self.error, self.preloads = providers, error, 0

    def get_available_providers(self):
        return self.providers

    def preload_dlls(self):
        self.preloads += 1
        if self.error is not None:
            raise self.error


@pytest.fixture
def fake(monkeypatch):
    def install(providers, gpu_present, error=None, module=None):
        module = module or FakeOnnxruntime(providers, error)
        monkeypatch.setattr(runtime, "ort", module)
        monkeypatch.setattr(runtime, "nvidia_device_present", lambda: gpu_present)
        monkeypatch.setattr(runtime, "loaded_cuda_libraries", lambda: list(LIBRARIES))
        return module

    return install


@pytest.mark.parametrize(
    "device, providers, gpu_present, preloaded",
    [
        ("cpu", [CUDA, CPU], True, False),
        ("auto", [CUDA, CPU], True, True),
        ("auto", [CUDA, CPU], False, False),  # a GPU build on a machine without a GPU: nothing to load
        ("auto", [CPU], True, False),  # the CPU build
        ("cuda", [CUDA, CPU], False, True),  # asked for: tried, and the provider says later whether it runs
        ("cuda", [CPU], True, False),
    ],
)
def test_preload_happens_exactly_when_cuda_will_be_asked_for(fake, device, providers, gpu_present, preloaded, caplog):
    module = fake(providers, gpu_present)
    with caplog.at_level(logging.INFO, logger="service.serving.runtime"):
        found = preload_cuda_libraries(device)
    assert module.preloads == int(preloaded)
    assert found == (LIBRARIES if preloaded else None)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CUDA libraries loaded")]
    assert logged == ([f"CUDA libraries loaded: {', '.join(LIBRARIES)}"] if preloaded else [])


def test_a_failing_preload_is_logged_and_never_stops_the_start(fake, caplog):
    fake([CUDA, CPU], True, error=OSError("libcudnn.so.9: cannot open shared object file"))
    with caplog.at_level(logging.INFO, logger="service.serving.runtime"):
        assert preload_cuda_libraries("cuda") == LIBRARIES
    assert any(r.levelno == logging.WARNING and "libcudnn.so.9" in r.getMessage() for r in caplog.records)


def test_an_onnxruntime_without_preload_dlls_falls_back_to_the_library_path(fake, caplog):
    module = types.SimpleNamespace(__version__="1.20.1", get_available_providers=lambda: [CUDA, CPU])
    fake([CUDA, CPU], True, module=module)
    with caplog.at_level(logging.INFO, logger="service.serving.runtime"):
        assert preload_cuda_libraries("auto") == LIBRARIES
    assert any("1.20.1 has no preload_dlls()" in r.getMessage() for r in caplog.records)


def test_the_repository_preloads_once_at_start_up_and_health_reports_the_libraries(
    tmp_path, linear_artifact, monkeypatch
):
    linear_artifact(tmp_path, "alpha", "1")
    linear_artifact(tmp_path, "beta", "1")
    calls = []
    monkeypatch.setattr(
        "service.serving.repository.preload_cuda_libraries", lambda device: calls.append(device) or LIBRARIES
    )
    repository = ModelRepository(Settings(artifacts=tmp_path, device="auto"))
    repository.load()
    assert calls == ["auto"] and repository.cuda_libraries == LIBRARIES
    assert sorted(repository.models) == ["alpha", "beta"]


def test_the_loaded_libraries_are_read_from_the_process_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /site/nvidia/cu13/lib/libcudart.so.13\n"
        "7f01-7f02 r--p 00001000 08:01 1 /site/nvidia/cu13/lib/libcudart.so.13\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /site/nvidia/cudnn/lib/libcudnn_graph.so.9\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n"
    )
    assert loaded_cuda_libraries(maps) == [
        "/site/nvidia/cu13/lib/libcudart.so.13",
        "/site/nvidia/cudnn/lib/libcudnn_graph.so.9",
    ]
    assert loaded_cuda_libraries(tmp_path / "absent") == []


def test_cuda_sessions_get_tf32_off_unless_asked_and_the_configured_algorithm_search(fake):
    fake([CUDA, CPU], True)
    assert provider_options(Settings(device="cuda")) == [
        (CUDA, {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}),
        CPU,
    ]
    assert provider_options(
        Settings(device="auto", runtime={"cuda_tf32": True, "cuda_conv_algo_search": "EXHAUSTIVE"})
    ) == [
        (CUDA, {"use_tf32": "1", "cudnn_conv_algo_search": "EXHAUSTIVE"}),
        CPU,
    ]
    assert provider_options(Settings(device="cpu", runtime={"cuda_tf32": True})) == [CPU]
