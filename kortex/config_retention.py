"""``[retention]`` (``KORTEX_RETENTION__*``): how long old rows are kept before the watchdog's
leader deletes them (kortex/storage/retention.py, README "Retention")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kortex.config_values import Seconds


def _days_or_off(value: Any) -> Any:
    """A number of days, or ``"off"``: kept forever. TOML has no null and the environment only
    text, so "off" is how either says it."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    if isinstance(value, str) and not value.strip().isdigit():
        raise ValueError('use a whole number of days, or "off" to keep forever')
    return value


Days = Annotated[int | None, BeforeValidator(_days_or_off)]


class RetentionSettings(BaseModel):
    """Rows older than these many days are deleted; ``"off"`` keeps them forever. Chat sessions,
    their turns and messages, proposals, incidents and finished post-mortem documents are never
    deleted by age (README "Retention" says why)."""

    model_config = ConfigDict(extra="forbid")

    # logs, metric samples, spans, deploys and LLM-ops requests of the embedded store
    telemetry_days: Days = Field(30, ge=1)
    # The audit trail is evidence and what calls were billed: at least a month (a billing period,
    # whatever its length) always stays, so a mistyped 4 for 400 cannot wipe it.
    audit_days: Days = Field(400, ge=31)
    # finished post-mortem jobs, with their items and progress events
    postmortem_days: Days = Field(180, ge=1)
    # API keys this long after their revocation (their audit rows stay, under audit_days). At
    # least a day: the embedded mode's revocation epoch names the last day's revoked keys
    # (kortex/keys.py revocation_epoch), so none of those may go while it may still be unread.
    revoked_keys_days: Days = Field(90, ge=1)
    every: Seconds = Field(3600.0, ge=1)  # how often the watchdog's leader prunes
    # Each batch deletes at most this many rows of one table and tenant in a transaction of its
    # own, so no delete holds its locks long; a run stops starting batches after run_seconds,
    # and the sweep it shares the watchdog's loop with waits for it no longer than that.
    batch_rows: int = Field(5000, ge=1, le=100_000)
    run_seconds: Seconds = Field(10.0, gt=0, le=3600)

    @property
    def enabled(self) -> bool:
        return any(days is not None for days in (self.telemetry_days, self.audit_days, self.postmortem_days,
                                                 self.revoked_keys_days))


__all__ = ["RetentionSettings"]
