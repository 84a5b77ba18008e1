"""``koder-ai``: the name reserved for Koder's internal model (rfc-005 §4.4). Not available yet."""

from __future__ import annotations

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderUnavailable
from kortex.llm.base import Provider


def create(name: str, config: ProviderSettings, settings: Settings) -> Provider:
    raise ProviderUnavailable("koder-ai is reserved for Koder's internal model and is not available yet",
                              provider=name)
