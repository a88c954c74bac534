"""Run at start-up by every Python process of a service that ``bench.engine`` starts with this folder on PYTHONPATH
(the in-process service, a pod's engine and front-ends): ``bench.engine.fitted.install`` stretches each onnxruntime
call to the batch time ``CALIB_BENCH_BATCH_MS`` gives, where it is set."""

import os

if os.environ.get("CALIB_BENCH_BATCH_MS"):
    from bench.engine.fitted import install

    install(os.environ["CALIB_BENCH_BATCH_MS"])
