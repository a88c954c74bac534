# syntax=docker/dockerfile:1
# The serving image: calibkit + service + the model repository; no torch, no training dependencies.
#   docker build -t calibrated-serving .                               CPU image (onnxruntime)
#   docker build --build-arg VARIANT=gpu -t calibrated-serving:gpu .   CUDA image (onnxruntime-gpu)
#   docker run -p 8000:8000 calibrated-serving      (artifacts baked in; mount /app/artifacts to replace)
ARG VARIANT=cpu
ARG VERSION=0.1.0

# Build only our own wheel (pure Python); each runtime resolves binary dependencies for its Python.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY calibkit ./calibkit
COPY service ./service
COPY training/__init__.py ./training/__init__.py
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm AS runtime-cpu
# one process: inference in process, no IPC (CALIB_FRONTENDS, docs/settings.md)
ENV EXTRAS=api,cpu \
    CALIB_FRONTENDS=1

FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 AS runtime-gpu
# Ubuntu's python3 is the interpreter of this variant; versions follow the pinned CUDA base image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
# a pod: one engine process owns the GPU, front-end processes on the other cores (CALIB_FRONTENDS=auto)
ENV PATH=/opt/venv/bin:$PATH \
    EXTRAS=service \
    CALIB_FRONTENDS=auto

# runtime-${VARIANT} names one of the two stages above, not an image that could be pinned.
# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS runtime
ARG VERSION
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CALIB_HOST=0.0.0.0 \
    CALIB_PORT=8000 \
    CALIB_ARTIFACTS=/app/artifacts \
    CALIB_STORE__URL=sqlite:////app/data/monitoring.db
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "calibrated-serving[${EXTRAS}] @ file:///wheels/calibrated_serving-${VERSION}-py3-none-any.whl" \
    && rm -rf /wheels
WORKDIR /app
COPY --chown=10001:10001 artifacts ./artifacts
RUN mkdir -p /app/data && chown 10001:10001 /app/data
VOLUME ["/app/data"]
USER 10001
EXPOSE 8000 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
CMD ["python", "-m", "service"]
