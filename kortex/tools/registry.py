"""The catalogue of tool specs known to this process; name collisions fail at start-up."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from kortex.llm.base import ToolSchema
from kortex.tools.policy import ToolPolicy
from kortex.tools.spec import ToolSpec

# OpenAI allows only [a-zA-Z0-9_-]{1,64}; the other vendors accept that subset too.
_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}\Z")


class ToolRegistry:
    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._schemas: dict[ToolPolicy, tuple[ToolSchema, ...]] = {}
        self._offered: dict[tuple[str, frozenset[str] | None], frozenset[str]] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> None:
        if not _NAME.match(spec.name):
            raise ValueError(f"tool name {spec.name!r} must match {_NAME.pattern}")
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is registered twice")
        spec.input_schema  # noqa: B018 - build (and so check) the schema now, not on first call
        spec.allowlist  # noqa: B018
        self._specs[spec.name] = spec
        self._schemas.clear()
        self._offered.clear()

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def offered(self, profile: str, names: frozenset[str] | None = None) -> frozenset[str]:
        """The tools (of ``names``, default all) that turns of ``profile`` may be offered: most
        tools every profile, an output channel only the profiles it names. Asked on every step
        and tool call, so kept once worked out."""
        key = (profile, names)
        found = self._offered.get(key)
        if found is None:
            found = frozenset(s.name for s in self._specs.values()
                              if (names is None or s.name in names) and (s.profiles is None or profile in s.profiles))
            self._offered[key] = found
        return found

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def catalog(self, policy: ToolPolicy) -> list[ToolSpec]:
        """The tools a model may see under ``policy`` (the pipeline enforces it again)."""
        return [s for s in self._specs.values() if policy.decide(s) == "allow"]

    def schemas(self, policy: ToolPolicy) -> tuple[ToolSchema, ...]:
        """What the model is told of the tools ``policy`` allows. Built once per policy: every LLM
        step asks, and validating sixteen nested JSON Schemas into models each time was a tenth of
        a turns worker's CPU (py-spy)."""
        cached = self._schemas.get(policy)
        if cached is None:
            cached = tuple(ToolSchema(name=s.name, description=s.description, input_schema=s.input_schema)
                           for s in self.catalog(policy))
            if len(self._schemas) >= 256:  # policies are few (deployment, narrowed per tenant); stay bounded
                self._schemas.clear()
            self._schemas[policy] = cached
        return cached
