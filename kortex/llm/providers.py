"""The provider factories this build ships: one line per provider."""

from __future__ import annotations

from kortex.llm import offline, scripted
from kortex.llm.registry import ProviderFactory

BUILTIN_PROVIDERS: dict[str, ProviderFactory] = {
    "offline": offline.create,
    "scripted": scripted.create,
}
