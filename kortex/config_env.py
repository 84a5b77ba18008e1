"""``KORTEX_*`` environment variables that are no setting: refused at load, with the likely one
named."""

from __future__ import annotations

import os

from pydantic import BaseModel

from kortex.config_errors import did_you_mean
from kortex.errors import ConfigError

#: KORTEX_* variables read outside these settings: by the CLI, logging, the metrics server, the
#: tests (KORTEX_TEST_*) and the bench (KORTEX_BENCH_*). Any other is a misspelt setting.
OTHER_VARIABLES = frozenset({"KORTEX_CONFIG", "KORTEX_API_KEY", "KORTEX_API_URL", "KORTEX_DEBUG",
                             "KORTEX_LOG_FORMAT", "KORTEX_METRICS_DIR", "KORTEX_METRICS_PORT", "KORTEX_ACCESS_LOG"})
OTHER_PREFIXES = ("KORTEX_TEST_", "KORTEX_BENCH_")


def _variable_names(model: type[BaseModel], prefix: str = "KORTEX_", depth: int = 2) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        names.append(prefix + name.upper())
        if depth and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names += _variable_names(field.annotation, f"{prefix}{name.upper()}__", depth - 1)
    return names


def check_environment(settings: type[BaseModel]) -> None:
    """Refuse a KORTEX_* variable that is no setting: pydantic-settings ignores it, and a
    misspelt KORTEX_REDIS_URL quietly ran a process embedded. Keys under a section are refused
    by the section itself (``_Section``); the value is never quoted."""
    unknown = []
    for name in os.environ:
        upper = name.upper()
        if (not upper.startswith("KORTEX_") or upper in OTHER_VARIABLES or upper.startswith(OTHER_PREFIXES)
                or upper[len("KORTEX_"):].split("__")[0].lower() in settings.model_fields):
            continue
        unknown.append(name)
    if unknown:
        known = [*_variable_names(settings), *OTHER_VARIABLES]
        raise ConfigError("invalid configuration: " + "; ".join(
            f"{name} is not a setting{did_you_mean(name.upper(), known)}" for name in sorted(unknown)))
