"""The settings' old names, accepted for one release with a ``FutureWarning`` that names the new one.

``RENAMED`` maps each old name (``CALIB_<OLD>`` in the environment) to the dotted path of the setting that replaced
it; ``REMOVED`` lists the old settings that are now fixed, which are ignored. The ``DeprecatedNames`` source reads
these names only, after the init arguments and the environment, so that a new name set anywhere wins over an old one
(and the warning says the old one was ignored). In code, ``Settings`` takes the new shape only.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from service.settings.groups import env_name

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
    """Whether ``state`` (the values gathered so far) gives the setting at ``path``: its value, or its whole group."""
    node: Any = state
    for key in path.split("."):
        if isinstance(node, BaseModel):  # a group given whole: its fields are all given
            return True
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def _put(values: dict[str, Any], path: str, value: Any) -> None:
    *groups, name = path.split(".")
    for group in groups:
        values = values.setdefault(group, {})
    values[name] = value


def _warn(message: str) -> None:
    # shown by default, once per message; no stack level names the caller: pydantic-settings calls the source
    warnings.warn(message, FutureWarning, stacklevel=1)


def _text(value: Any) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


class DeprecatedNames(PydanticBaseSettingsSource):
    """The values of the old names in the environment that ``env`` (the env source) read, each at its new path unless
    a source before this one (the init arguments, the new names) gave that path. Each old name found is warned about.

    An old name that is now a group's name (``CALIB_PREDICTION_LOG=false``) holds the old setting unless its value is
    a JSON object (the group's): such a value is taken out of ``env``, which would fail to read it as the group."""

    def __init__(self, settings_cls: type[BaseSettings], env: EnvSettingsSource):
        super().__init__(settings_cls)
        self.environ = env.env_vars
        self.prefix, self.case_sensitive = env.env_prefix, env.case_sensitive
        shadowed = {self._key(old) for old in SHADOWED if self._plain(old) is not None}
        env.env_vars = {name: value for name, value in self.environ.items() if name not in shadowed}

    def _key(self, old: str) -> str:
        """The old name's key in ``environ``."""
        return self.prefix + old if self.case_sensitive else (self.prefix + old).lower()

    def _plain(self, old: str) -> str | None:
        """The old name's value in the environment (a group's JSON object is not one)."""
        value = self.environ.get(self._key(old))
        return None if value is None or (old in SHADOWED and value.lstrip().startswith("{")) else value

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` reads the old names, which are no fields."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for old, path in RENAMED.items():
            value = self._plain(old)
            if value is None:
                continue
            name = (self.prefix + old).upper()
            if old == "admin_token":  # one more admin token, named admin, beside CALIB_ADMIN_TOKENS' as before
                value = f"admin:{_text(value)}"
                if _is_set(values, path):
                    value = f"{_text(values['auth']['admin_tokens'])},{value}"
            if _is_set(self.current_state, path):
                _warn(f"{name} is deprecated and was ignored: {env_name(path)} is set")
                continue
            _warn(f"{name} is deprecated; use {replacement(old)}")
            _put(values, path, value)
        for old, fixed in REMOVED.items():
            if self._plain(old) is not None:
                _warn(f"{(self.prefix + old).upper()} is no longer a setting and is ignored (fixed: {fixed})")
        return values
