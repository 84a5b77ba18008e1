"""Configuration errors in words a person can act on: where, what, and the key they may have
meant, never the offending value (kortex/config.py reports through these)."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def did_you_mean(key: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings model that holds the key at ``loc`` (a validation error's location) under
    ``root``, walking fields and skipping the free keys of dict-valued sections (provider and
    tool names)."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(str(part))
            if field is None:
                return None
            model = field.annotation
        elif typing.get_origin(model) is dict:
            model = typing.get_args(model)[1]
        else:
            return None
        while typing.get_origin(model) in (typing.Union, types.UnionType):  # Optional[Section]
            model = next((a for a in typing.get_args(model) if a is not type(None)), None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def describe_errors(exc: ValidationError, root: type[BaseModel], limit: int = 20) -> str:
    """Where and what, never the offending value: a misspelt key often holds a secret
    (``apikey = "sk-..."``), and pydantic's own text quotes every input."""
    errors = exc.errors(include_url=False, include_context=False)
    parts = []
    for e in errors[:limit]:
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden" and e["loc"]:
            holder = _model_at(root, tuple(e["loc"]))
            hint = did_you_mean(str(e["loc"][-1]), holder.model_fields) if holder else ""
            parts.append(f"{where}: unknown key{hint}")
        else:
            # pydantic's own messages quote no input (its str() appends it); a validator's may
            custom = e["type"] in ("value_error", "assertion_error")
            # A section's own validator names its settings, which its input holds as keys.
            section = _model_at(root, (*e["loc"], ""))
            keep = set(section.model_fields) if section else set()
            parts.append(f"{where}: {_without(e['msg'], e.get('input'), keep) if custom else e['msg']}")
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts)


def _without(message: str, value: Any, keep: typing.Collection[str] = ()) -> str:
    """A validator's message with the input it failed on taken out, should it quote it (ours
    name entries by position; this is for one that forgets)."""
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list | tuple | dict):  # a list's items, a table's keys
        texts = [v for v in value if isinstance(v, str) and v not in keep]
    else:
        texts = []
    for text in sorted(texts, key=len, reverse=True):
        if len(text) >= 4:  # shorter: nothing worth hiding, and common words would be blanked
            # whole words only: the known names a message lists often begin with a misspelt one
            message = re.sub(rf"(?<![\w-]){re.escape(text)}(?![\w-])", "[value]", message)
    return message
