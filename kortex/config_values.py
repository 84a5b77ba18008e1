"""The kinds of value a setting takes: durations (finite, at most a year), secrets and connection
URLs that may name an environment variable (``${VAR}``), log levels. kortex/config.py builds the
settings from them."""

from __future__ import annotations

import math
import os
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, SecretStr

from kortex.config_urls import MASKED, check_url
from kortex.errors import InvalidInput
from kortex.timeparse import parse_duration

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_env_refs(value: Any) -> Any:
    """Replace ``${VAR}`` with the variable's value; a wholly unresolved value becomes None."""
    if not isinstance(value, str) or "${" not in value:
        return value
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        found = os.environ.get(match.group(1))
        if not found:
            missing = True
            return ""
        return found

    resolved = _VAR.sub(sub, value)
    return None if missing else resolved


#: The longest duration a setting may take: a year. Every duration ends up in a timedelta added
#: to now, a Redis EXPIRE or a timer, where 1e12 seconds overflowed (a 500 for every post).
MAX_SECONDS = 365 * 86400.0


def _seconds(value: Any) -> Any:
    """Seconds as a number (also from the environment, where it arrives as text) or a duration
    such as ``"90s"``, ``"5m"``, ``"PT1H"``; finite and at most a year."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                value = parse_duration(value).total_seconds()
            except InvalidInput:
                # Not the parser's text: it quotes the value, and a misplaced secret would be shown.
                raise ValueError("not a number of seconds or a duration such as '90s', '5m', 'PT1H'") from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        if value > MAX_SECONDS:
            raise ValueError("must be at most a year (31536000 seconds)")
    return value


Seconds = Annotated[float, BeforeValidator(_seconds)]
Secret = Annotated[SecretStr | None, BeforeValidator(resolve_env_refs)]

# A connection URL stays a plain str for its consumers; wherever settings are shown its
# password is masked (kortex/config_urls.py).
EnvURL = Annotated[str | None, BeforeValidator(resolve_env_refs), AfterValidator(check_url), MASKED]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_LEVELS: tuple[str, ...] = typing.get_args(LogLevel)


def _log_level(value: Any) -> Any:
    """A level by logging's name in any case: logging itself (and uvicorn) take only their own
    spelling, and an unknown one crashed every command."""
    if isinstance(value, str) and value.upper() in LOG_LEVELS:
        return value.upper()
    raise ValueError(f"use one of {', '.join(level.lower() for level in LOG_LEVELS)} (any case)")
