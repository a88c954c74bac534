"""Service configuration from environment variables (prefix ``CALIB_``) and command-line flags.

The server's identity is top-level (``CALIB_PORT``); every other setting is in a group by concern
(``CALIB_CONFORMAL__METHOD``): ``groups`` defines them, ``model`` the ``Settings`` that holds them, ``deprecated``
the old names accepted for one release, and ``markdown`` the reference page ``docs/settings.md``
(``python -m service.settings --markdown``).
"""

from calibkit.alarms import AlarmPolicy
from service.settings.groups import (
    AuthSettings,
    BatchingConfig,
    ConformalSettings,
    LabelsSettings,
    LimitsSettings,
    MonitoringSettings,
    PodSettings,
    PredictionLogSettings,
    RuntimeSettings,
    StoreSettings,
    conformal_levels,
    env_name,
)
from service.settings.model import Device, Settings, setting_path

__all__ = [
    "AlarmPolicy",
    "AuthSettings",
    "BatchingConfig",
    "ConformalSettings",
    "Device",
    "LabelsSettings",
    "LimitsSettings",
    "MonitoringSettings",
    "PodSettings",
    "PredictionLogSettings",
    "RuntimeSettings",
    "Settings",
    "StoreSettings",
    "conformal_levels",
    "env_name",
    "setting_path",
]
