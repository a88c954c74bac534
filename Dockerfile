# syntax=docker/dockerfile:1
# The serving image: calibkit + service + the model repository; no torch, no training code deps.
#   docker build -t calibrated-serving .
#   docker run -p 8000:8000 calibrated-serving          (artifacts baked in; mount /app/artifacts to replace)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG VERSION=0.1.0

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY calibkit ./calibkit
COPY service ./service
COPY training/__init__.py ./training/__init__.py
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[service]"

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CALIB_HOST=0.0.0.0 \
    CALIB_PORT=8000 \
    CALIB_ARTIFACTS=/app/artifacts \
    CALIB_DATABASE_URL=sqlite:////app/data/monitoring.db
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "calibrated-serving[service]==${VERSION}" && rm -rf /wheels
WORKDIR /app
COPY --chown=app:app artifacts ./artifacts
RUN mkdir -p /app/data && chown 10001:10001 /app/data
VOLUME ["/app/data"]
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
CMD ["python", "-m", "service"]
