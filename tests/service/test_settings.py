"""The settings: old names still accepted for one release (each warned about, a new name winning over its old one),
one way to give each group's tokens, and docs/settings.md as the models generate it."""

import contextlib
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from service.auth import AccessControl
from service.settings import Settings, setting_path
from service.settings_env import REMOVED, RENAMED, env_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_settings_in_the_environment(monkeypatch):
    """Only what a test sets (the suite exports a store and a gRPC port for every service)."""
    for name in list(os.environ):
        if name.upper().startswith("CALIB_"):
            monkeypatch.delenv(name)


def _field(path: str):
    group, name = path.split(".")
    return Settings.model_fields[group].annotation.model_fields[name]


def _other_value(path: str) -> str:
    """A valid value of the setting at ``path`` other than its default, as the environment gives it."""
    field = _field(path)
    default, annotation = field.get_default(), field.annotation
    choices = [c for a in (annotation, *typing.get_args(annotation)) for c in typing.get_args(a) if isinstance(c, str)]
    if choices:
        return next(c for c in choices if c != default)
    if annotation is bool:
        return str(not default).lower()
    if SecretStr in typing.get_args(annotation):
        return "a:token-a"
    if default is None:
        return {"auth": "/run/tokens", "conformal": "0.25", "pod": "3"}.get(path.split(".")[0], "x")
    if isinstance(default, str):
        return default + "0"
    return str(default * 2 or 1)


def _get(settings: Settings, path: str):
    group, name = path.split(".")
    return getattr(getattr(settings, group), name)


@pytest.mark.parametrize("old", [old for old in RENAMED if old != "admin_token"])
def test_each_old_name_sets_its_new_setting_and_warns_naming_it(old, monkeypatch):
    path, value = RENAMED[old], _other_value(RENAMED[old])
    monkeypatch.setenv(env_name(path), value)
    expected = Settings()
    monkeypatch.delenv(env_name(path))
    monkeypatch.setenv(f"CALIB_{old.upper()}", value)
    with pytest.warns(FutureWarning, match=f"^CALIB_{old.upper()} is deprecated; use {env_name(path)}$"):
        settings = Settings()
    assert settings == expected and _get(settings, path) != _field(path).get_default()


@pytest.mark.parametrize("old", ["conformal_levels", "database_url", "prediction_log", "coverage_alarm_threshold"])
def test_a_new_name_wins_over_its_old_one_and_the_warning_says_the_old_one_was_ignored(old, monkeypatch):
    path, default = RENAMED[old], _field(RENAMED[old]).get_default()
    monkeypatch.setenv(f"CALIB_{old.upper()}", _other_value(path))
    monkeypatch.setenv(env_name(path), str(default))
    with pytest.warns(FutureWarning, match=f"^CALIB_{old.upper()} is deprecated and was ignored: {env_name(path)}"):
        assert _get(Settings(), path) == default
    monkeypatch.delenv(env_name(path))
    group = path.split(".")[0]
    whole = Settings.model_fields[group].annotation()
    with pytest.warns(FutureWarning, match="was ignored"):  # a group given whole gives all of its fields
        assert _get(Settings(**{group: whole}), path) == default
    with pytest.warns(FutureWarning, match="is deprecated; use"):  # a dict gives only the fields it holds
        assert _get(Settings(**{group: {}}), path) != default


@pytest.mark.parametrize("removed", list(REMOVED))
def test_a_removed_setting_warns_that_it_is_no_longer_one_and_is_ignored(removed, monkeypatch):
    monkeypatch.setenv(f"CALIB_{removed.upper()}", "1")
    with pytest.warns(FutureWarning, match=f"^CALIB_{removed.upper()} is no longer a setting and is ignored"):
        settings = Settings()
    monkeypatch.delenv(f"CALIB_{removed.upper()}")
    assert settings == Settings()


def test_the_old_admin_token_is_an_admin_token_named_admin(monkeypatch):
    monkeypatch.setenv("CALIB_ADMIN_TOKEN", "root-token")
    with pytest.warns(FutureWarning, match="^CALIB_ADMIN_TOKEN is deprecated; use CALIB_AUTH__ADMIN_TOKENS=admin:<t"):
        settings = Settings()
    assert settings.auth.admin_tokens == SecretStr("admin:root-token")
    assert AccessControl(settings).check("admin", "Bearer root-token") == "admin"
    monkeypatch.setenv("CALIB_ADMIN_TOKENS", "ops:ops-token")  # both old names: both tokens, as before
    with pytest.warns(FutureWarning):
        access = AccessControl(Settings())
    assert access.check("admin", "Bearer root-token") == "admin" and access.check("admin", "Bearer ops-token") == "ops"
    monkeypatch.setenv("CALIB_AUTH__ADMIN_TOKENS", "new:new-token")
    with pytest.warns(FutureWarning) as warned:
        assert Settings().auth.admin_tokens == SecretStr("new:new-token")
    assert [str(w.message).split(" is ")[:2] for w in warned] == [
        ["CALIB_ADMIN_TOKENS", "deprecated and was ignored: CALIB_AUTH__ADMIN_TOKENS"],
        ["CALIB_ADMIN_TOKEN", "deprecated and was ignored: CALIB_AUTH__ADMIN_TOKENS"],
    ]


@pytest.mark.parametrize("group", ["predict", "feedback", "admin"])
@pytest.mark.parametrize("names", ["new", "old"])
def test_a_groups_tokens_inline_and_in_a_file_are_refused_naming_both_variables(group, names, monkeypatch, tmp_path):
    (tmp_path / "tokens").write_text("a:secret-in-file\n")
    prefix = "CALIB_AUTH__" if names == "new" else "CALIB_"
    monkeypatch.setenv(f"{prefix}{group.upper()}_TOKENS", "a:secret-inline")
    monkeypatch.setenv(f"{prefix}{group.upper()}_TOKENS_FILE", str(tmp_path / "tokens"))
    with pytest.warns(FutureWarning) if names == "old" else contextlib.nullcontext():
        with pytest.raises(ValidationError) as error:
            Settings()
    inline, file = f"CALIB_AUTH__{group.upper()}_TOKENS", f"CALIB_AUTH__{group.upper()}_TOKENS_FILE"
    assert f"{inline} and {file} are both set" in str(error.value) and "secret" not in str(error.value)


@pytest.mark.parametrize("value, enabled", [("false", False), ("True", True), ("0", False), ("off", False)])
def test_the_old_prediction_log_switch_is_read_though_the_group_has_its_name(value, enabled, monkeypatch):
    monkeypatch.setenv("CALIB_PREDICTION_LOG", value)
    monkeypatch.setenv("CALIB_PREDICTION_LOG__QUEUE", "500")
    with pytest.warns(FutureWarning, match="use CALIB_PREDICTION_LOG__ENABLED"):
        log = Settings().prediction_log
    assert (log.enabled, log.queue) == (enabled, 500)
    monkeypatch.setenv("CALIB_PREDICTION_LOG", '{"enabled": false, "durability": "sync"}')  # the group as JSON
    log = Settings().prediction_log
    assert (log.enabled, log.durability, log.queue) == (False, "sync", 500)


def test_the_warnings_are_shown_by_default():
    env = dict(os.environ, CALIB_N_BINS="20", CALIB_GC_THRESHOLD="5")
    done = subprocess.run(
        [sys.executable, "-c", "from service.settings import Settings; print(Settings().monitoring.n_bins)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "20\n", done.stderr
    assert "FutureWarning: CALIB_N_BINS is deprecated; use CALIB_MONITORING__N_BINS" in done.stderr
    assert "FutureWarning: CALIB_GC_THRESHOLD is no longer a setting" in done.stderr


def test_variables_name_their_setting_and_old_names_none():
    assert setting_path("CALIB_PORT") == "port" and setting_path("CALIB_CONFORMAL__METHOD") == "conformal.method"
    assert setting_path("CALIB_ALARM__THRESHOLD") == "alarm.threshold" and setting_path("CALIB_AUTH") == "auth"
    for name in ("CALIB_DATABASE_URL", "CALIB_ALARM__NOPE", "CALIB_PORT__X", "MPLCONFIGDIR", "CALIB_GC_THRESHOLD"):
        assert setting_path(name) is None, name
    assert all(setting_path(env_name(path)) == path for path in RENAMED.values())


def test_the_settings_page_is_generated_from_the_models():
    command = "python scripts/settings_doc.py > docs/settings.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings_doc.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "docs" / "settings.md").read_text(), f"docs/settings.md is stale: run `{command}`"
