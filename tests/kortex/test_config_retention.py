"""``[retention]``: its defaults, "off" from kortex.toml or the environment, and what is refused."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from kortex import keys
from kortex.config import load_settings
from kortex.config_retention import RetentionSettings
from kortex.errors import ConfigError


def test_the_defaults_keep_a_month_of_telemetry_and_prune_hourly_in_small_batches() -> None:
    kept = load_settings().retention
    assert (kept.telemetry_days, kept.audit_days, kept.postmortem_days, kept.revoked_keys_days) == (30, 400, 180, 90)
    assert (kept.every, kept.batch_rows, kept.run_seconds) == (3600.0, 5000, 10.0) and kept.enabled


def test_off_keeps_forever_from_the_environment_or_kortex_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kortex.toml").write_text('[retention]\npostmortem_days = "off"\naudit_days = 730\n'
                                          'revoked_keys_days = "off"\n')
    monkeypatch.setenv("KORTEX_RETENTION__TELEMETRY_DAYS", "OFF")
    monkeypatch.setenv("KORTEX_RETENTION__EVERY", "30m")
    kept = load_settings().retention
    assert (kept.telemetry_days, kept.audit_days, kept.postmortem_days, kept.revoked_keys_days, kept.every) == (
        None, 730, None, None, 1800.0)
    monkeypatch.setenv("KORTEX_RETENTION__AUDIT_DAYS", "off")
    assert not load_settings().retention.enabled
    monkeypatch.setenv("KORTEX_RETENTION__REVOKED_KEYS_DAYS", "7")  # the one policy still on
    assert load_settings().retention.enabled


@pytest.mark.parametrize(("name", "value", "said"), [
    ("KORTEX_RETENTION__AUDIT_DAYS", "4", "retention.audit_days"),  # a month of audit always stays
    ("KORTEX_RETENTION__TELEMETRY_DAYS", "0", "retention.telemetry_days"),
    ("KORTEX_RETENTION__REVOKED_KEYS_DAYS", "0", "retention.revoked_keys_days"),
    ("KORTEX_RETENTION__TELEMETRY_DAYS", "never", '"off" to keep forever'),
    ("KORTEX_RETENTION__BATCH_ROWS", "0", "retention.batch_rows"),
    ("KORTEX_RETENTION__TELEMTRY_DAYS", "30", "did you mean 'telemetry_days'"),
])
def test_what_cannot_be_run_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                          said: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="invalid configuration") as refused:
        load_settings()
    assert said in str(refused.value)


def test_a_revoked_key_is_kept_as_long_as_the_embedded_revocation_epoch_names_it() -> None:
    """kortex/keys.py revocation_epoch names the keys revoked in the last RECENT_REVOCATIONS: were
    one deleted sooner, a run could delete as many as are revoked meanwhile unseen."""
    with pytest.raises(ValidationError):
        RetentionSettings(revoked_keys_days=0)
    assert timedelta(days=1) >= keys.RECENT_REVOCATIONS
