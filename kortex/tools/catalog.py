"""The tool catalog a tenant's sessions see: what the policy allows, with each tool's schema,
effect and effective time limits. The HTTP API and (later) the MCP server serve the same list."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kortex.tools.pipeline import ToolPipeline
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry


class CatalogEntry(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any]
    effect: str
    category: str
    timeout_s: float        # the effective timeout: configured or default, clamped to the ceiling
    max_timeout_s: float    # the category's hard ceiling


def catalog(registry: ToolRegistry, policy: ToolPolicy, pipeline: ToolPipeline) -> list[CatalogEntry]:
    return [
        CatalogEntry(name=s.name, description=s.description, input_schema=s.input_schema, effect=s.effect.value,
                     category=s.category, timeout_s=pipeline.timeout_for(s), max_timeout_s=s.limits.max_timeout)
        for s in registry.catalog(policy)
    ]
