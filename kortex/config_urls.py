"""Connection URLs in settings: the real value for the code that connects, the password masked
wherever settings are shown (repr, str, dumps)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, PlainSerializer

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


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def check_url(url: str | None) -> str | None:
    """A URL with a scheme and, if it names one, a port that is a number a port can be: refused
    at load, naming the setting, rather than by the client that first connects ("unexpected
    ValueError"). The words never quote it (it may hold a password)."""
    if not url:
        return url
    if not _SCHEME.match(url):
        raise ValueError("not a URL: write it scheme://host[:port]/...")
    # The host runs from the last "@" (a password may hold "/" and "@" unescaped) to the path.
    host = url.split("://", 1)[1].rsplit("@", 1)[-1].split("/", 1)[0].split("?", 1)[0]
    port = host.rpartition("]")[2] if host.startswith("[") else host
    if "," not in host and ":" in port:  # several hosts (libpq): each client parses its own list
        digits = port.rpartition(":")[2]
        if digits and not (digits.isdigit() and 1 <= int(digits) <= 65535):
            raise ValueError("the port is not a number from 1 to 65535")
    return url


# A URL that may carry a password stays a plain str for its consumers (SecretStr would make each
# of them unwrap it); what shows it is masked instead: dumps through this serializer, reprs
# through masked_repr, which looks for it in a field's metadata.
MASKED = PlainSerializer(mask_url)
URL = Annotated[str | None, AfterValidator(check_url), MASKED]


def masked_repr(model: BaseModel, args: Iterable[tuple[str | None, Any]]) -> Iterator[tuple[str | None, Any]]:
    """A settings model's ``__repr_args__`` with its URL fields masked."""
    fields = type(model).model_fields
    for name, value in args:
        field = fields.get(name) if name else None
        masked = field is not None and any(m is MASKED for m in field.metadata)
        yield name, mask_url(value) if masked and isinstance(value, str) else value


__all__ = ["MASKED", "URL", "check_url", "mask_url", "masked_repr"]
