"""Connection URLs in settings: the real value for the code that connects, the password masked
wherever settings are shown (repr, str, dumps)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

from pydantic import BaseModel, PlainSerializer

from kortex.redaction import REDACTED, scrub_text

# scheme://user:password@host: the password runs to the last "@", as people write passwords
# with "/" or "@" in them unescaped (and some URL parsers accept them). The value is known to
# be one URL, so this can take more than scrub_text's pattern, which must stop within text.
_URL_PASSWORD = re.compile(r"(?s)^([A-Za-z][A-Za-z0-9+.-]*://[^:/]*:)(.*)@")


def mask_url(url: str | None) -> str | None:
    """``url`` fit to show: the password of its user part and credential-named query parameters
    (``?password=...``) replaced, ``postgresql://kortex:[REDACTED]@db/kortex``."""
    if not url:
        return url
    return scrub_text(_URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", url, count=1))


# A URL that may carry a password stays a plain str for its consumers (SecretStr would make each
# of them unwrap it); what shows it is masked instead: dumps through this serializer, reprs
# through masked_repr, which looks for it in a field's metadata.
MASKED = PlainSerializer(mask_url)
URL = Annotated[str | None, MASKED]


def masked_repr(model: BaseModel, args: Iterable[tuple[str | None, Any]]) -> Iterator[tuple[str | None, Any]]:
    """A settings model's ``__repr_args__`` with its URL fields masked."""
    fields = type(model).model_fields
    for name, value in args:
        field = fields.get(name) if name else None
        masked = field is not None and any(m is MASKED for m in field.metadata)
        yield name, mask_url(value) if masked and isinstance(value, str) else value


__all__ = ["MASKED", "URL", "mask_url", "masked_repr"]
