#!/usr/bin/env bash
# Debian tools the tests use for real, installed only when missing: docker-compose (checks the compose
# file), prometheus + promtool (alert rules, end-to-end scraping), chromium (the dashboard page), wrk
# (the load generator of `make bench`), h2load (its gRPC load generator), postgresql (the throwaway server the
# test suite starts when CALIB_TEST_DATABASE_URL names none).
set -euo pipefail
missing=()
command -v docker-compose >/dev/null || missing+=(docker-compose)
{ command -v promtool >/dev/null && command -v prometheus >/dev/null; } || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
command -v wrk >/dev/null || missing+=(wrk)
command -v h2load >/dev/null || missing+=(nghttp2-client)
{ command -v pg_ctl >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; } || missing+=(postgresql)
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
