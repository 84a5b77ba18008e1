"""The provider factories this build ships: one line per provider."""

from __future__ import annotations

from kortex.llm import anthropic, koder_ai, offline, ollama, openai, scripted
from kortex.llm.registry import ProviderFactory

BUILTIN_PROVIDERS: dict[str, ProviderFactory] = {
    "offline": offline.create,
    "anthropic": anthropic.create,
    "openai": openai.create,
    "ollama": ollama.create,
    "koder-ai": koder_ai.create,
    "scripted": scripted.create,
}
