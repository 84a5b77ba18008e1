"""The offline analyst provider (rule-based, no LLM)."""

from kortex.llm.offline.provider import LABEL, OfflineAnalyst, create

__all__ = ["LABEL", "OfflineAnalyst", "create"]
