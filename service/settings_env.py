"""The environment of the settings (``service.settings``): each setting's variable (``env_name``), the grammar of
the values read by hand (tokens, coverage levels), and the old names accepted for one release: ``RENAMED`` maps each
to its setting now, applied once to the environment that ``Settings`` reads (``rename_old_names``). It imports
nothing of ``service``, so that the settings and ``service.auth`` can both use it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_settings import EnvSettingsSource

PREFIX = "CALIB_"


def env_name(path: str) -> str:
    """The environment variable of a setting's dotted path: ``conformal.method`` -> ``CALIB_CONFORMAL__METHOD``."""
    return PREFIX + path.upper().replace(".", "__")


def parse_tokens(text: str, source: str) -> dict[str, bytes]:
    """``name:token`` pairs separated by commas or new lines (blank lines and ``#`` comments skipped); a pair
    without a name or a token, or a name given twice, is refused naming ``source`` and the pair's position
    (never the token)."""
    tokens: dict[str, bytes] = {}
    pairs = [p.strip() for line in text.splitlines() if not line.lstrip().startswith("#") for p in line.split(",")]
    for position, pair in enumerate(p for p in pairs if p):
        name, sep, token = pair.partition(":")
        if not sep or not name.strip() or not token.strip():
            raise ValueError(f"{source}: entry {position + 1} is not name:token")
        if name.strip() in tokens:
            raise ValueError(f"{source}: the name {name.strip()!r} is given twice")
        tokens[name.strip()] = token.strip().encode()
    return tokens


def conformal_levels(value: str) -> tuple[float, ...]:
    """The coverage levels of ``CALIB_CONFORMAL__LEVELS``: comma-separated numbers in (0, 1), sorted, distinct."""
    name = env_name("conformal.levels")
    levels = []
    for entry in value.split(","):
        try:
            level = float(entry)
        except ValueError:
            raise ValueError(f"{name}: {entry.strip()!r} is not a number") from None
        if not 0 < level < 1:
            raise ValueError(f"{name}: {entry.strip()!r} is not in (0, 1)")
        levels.append(level)
    return tuple(sorted(set(levels)))


#: Old name -> the dotted path of its setting now (``CALIB_<OLD>`` -> ``CALIB_<GROUP>__<NAME>``).
RENAMED: dict[str, str] = {
    "cuda_tf32": "runtime.cuda_tf32",
    "cuda_conv_algo_search": "runtime.cuda_conv_algo_search",
    "pad_batches": "runtime.pad_batches",
    "bucket_sessions": "runtime.bucket_sessions",
    "intra_op_threads": "runtime.intra_op_threads",
    "engine_endpoint": "pod.engine_endpoint",
    "pod_index": "pod.index",
    "engine_wait_seconds": "pod.engine_wait_seconds",
    "max_rows_per_request": "limits.max_rows_per_request",
    "max_body_bytes": "limits.max_body_bytes",
    "max_image_pixels": "limits.max_image_pixels",
    "max_feedback_items": "limits.max_feedback_items",
    "retry_after_seconds": "limits.retry_after_seconds",
    "database_url": "store.url",
    "store_timeout_seconds": "store.timeout_seconds",
    "retention_days": "store.retention_days",
    "prediction_log": "prediction_log.enabled",
    "prediction_log_queue": "prediction_log.queue",
    "prediction_log_durability": "prediction_log.durability",
    "prediction_log_interval_seconds": "prediction_log.interval_seconds",
    "pending_label_seconds": "labels.pending_seconds",
    "pending_join_seconds": "labels.join_seconds",
    "trusted_label_sources": "labels.trusted_sources",
    "alarm_window": "monitoring.window",
    "n_bins": "monitoring.n_bins",
    "bootstrap_resamples": "monitoring.bootstrap_resamples",
    "detail_rows": "monitoring.detail_rows",
    "drift_rows": "monitoring.drift_rows",
    "evaluate_every_labels": "monitoring.evaluate_every_labels",
    "evaluate_sets_seconds": "monitoring.evaluate_sets_seconds",
    "evaluate_seconds": "monitoring.evaluate_seconds",
    "calibration_refresh_seconds": "monitoring.refresh_seconds",
    "webhook_url": "monitoring.webhook_url",
    "conformal_method": "conformal.method",
    "conformal_coverage": "conformal.coverage",
    "conformal_levels": "conformal.levels",
    "conformal_randomized": "conformal.randomized",
    "conformal_adaptation": "conformal.adaptation",
    "conformal_step": "conformal.step",
    "coverage_alarm_threshold": "conformal.alarm_threshold",
    "predict_tokens": "auth.predict_tokens",
    "predict_tokens_file": "auth.predict_tokens_file",
    "feedback_tokens": "auth.feedback_tokens",
    "feedback_tokens_file": "auth.feedback_tokens_file",
    "admin_tokens": "auth.admin_tokens",
    "admin_tokens_file": "auth.admin_tokens_file",
    # the single admin token <t>: the admin token admin:<t>, beside those of CALIB_ADMIN_TOKENS as before
    "admin_token": "auth.admin_tokens",
}

#: Old settings that are now fixed -> where their value is (they are ignored).
REMOVED: dict[str, str] = {
    "graph_optimization": "service.serving.runtime.GRAPH_OPTIMIZATION",
    "inter_op_threads": "service.serving.runtime.INTER_OP_THREADS",
    "io_binding": "service.serving.runtime.IO_BINDING",
    "switch_interval_ms": "Python's default; a pod's engine: service.engine.server.ENGINE_SWITCH_INTERVAL_MS",
    "gc_threshold": "service.cli.GC_THRESHOLD",
}

#: Old names that are now a group's name: their plain value (not a JSON object) is the old setting's.
SHADOWED = frozenset(old for old in RENAMED if old == RENAMED[old].split(".")[0])


def replacement(old: str) -> str:
    """What to set instead of ``CALIB_<OLD>``, as the warnings and docs/settings.md say it."""
    path = RENAMED[old]
    return f"{env_name(path)}=admin:<token>" if old == "admin_token" else env_name(path)


def _is_set(state: Mapping[str, Any], path: str) -> bool:
    """Whether ``state`` (values from a source) gives the setting at ``path``: its value, or its whole group."""
    node: Any = state
    for key in path.split("."):
        if isinstance(node, BaseModel):  # a group given whole: its fields are all given
            return True
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def _warn(message: str) -> None:
    # shown by default, once per message; no stack level names the caller: pydantic-settings builds the sources
    warnings.warn(message, FutureWarning, stacklevel=1)


def rename_old_names(env: EnvSettingsSource, given: Mapping[str, Any]) -> None:
    """Apply ``RENAMED`` to the environment that ``env`` read: each old name found goes to its new variable, with a
    warning, unless ``given`` (the init arguments) or the environment's new names give that setting; then the new
    name wins and the warning says the old one was ignored. An old name that is now a group's name
    (``CALIB_PREDICTION_LOG=false``) holds the old setting unless its value is a JSON object (the group's)."""

    def key(variable: str) -> str:
        return variable if env.case_sensitive else variable.lower()

    found: dict[str, str] = {}  # old name -> its value
    for old in [*RENAMED, *REMOVED]:
        value = env.env_vars.get(key(env_name(old)))
        if value is not None and not (old in SHADOWED and value.lstrip().startswith("{")):
            found[old] = value
    olds = {key(env_name(old)) for old in found}
    env.env_vars = {name: value for name, value in env.env_vars.items() if name not in olds}
    states: tuple[Mapping[str, Any], ...] = (given, env())  # what the init arguments and the new names give
    renamed: dict[str, str] = {}  # the new variables of the old names found
    for old, path in RENAMED.items():
        if (value := found.get(old)) is None:
            continue
        name, variable = env_name(old), key(env_name(path))
        if old == "admin_token":  # one more admin token, named admin, beside CALIB_ADMIN_TOKENS' as before
            value = f"admin:{value}" if variable not in renamed else f"{renamed[variable]},admin:{value}"
        if any(_is_set(state, path) for state in states):
            _warn(f"{name} is deprecated and was ignored: {env_name(path)} is set")
        else:
            _warn(f"{name} is deprecated; use {replacement(old)}")
            renamed[variable] = value
    for old, fixed in REMOVED.items():
        if old in found:
            _warn(f"{env_name(old)} is no longer a setting and is ignored (fixed: {fixed})")
    env.env_vars = {**env.env_vars, **renamed}
