"""Text as PostgreSQL can store it: NUL and lone surrogates refused from callers, replaced in
what a model writes."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kortex.errors import InvalidInput
from kortex.text import REPLACEMENT, Storable, check_storable, storable


@pytest.mark.parametrize("value,message", [
    ("a\x00b", "contains a NUL character"),
    ("caf\u00e9 \ud800", "is not valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"),
    ("\udcff", "is not valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"),  # an undecodable argv byte
])
def test_unstorable_text_is_refused_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_storable(value, "content")
    assert refused.value.details == [{"field": "content", "message": message}]

    class Body(BaseModel):
        content: Storable

    with pytest.raises(ValidationError) as invalid:
        Body(content=value)
    assert message in str(invalid.value)


@pytest.mark.parametrize("value", ["plain", "caf\u00e9 \U0001F600 \u4e2d", "", None])
def test_storable_text_passes(value: str | None) -> None:
    check_storable(value, "content")


def test_what_a_model_writes_has_unstorable_characters_replaced() -> None:
    assert storable("a\x00b\ud800c\udfff") == f"a{REPLACEMENT}b{REPLACEMENT}c{REPLACEMENT}"
    emoji = "fine \U0001F600 caf\u00e9"
    assert storable(emoji) is emoji  # nothing to replace: the same object, no copy


def test_the_domains_entry_points_refuse_it_naming_the_field(harness) -> None:  # type: ignore[no-untyped-def]
    from kortex import keys
    from kortex.turns import chat

    tenant = harness.tenant("acme")
    with pytest.raises(InvalidInput) as key:
        keys.create_key(harness.k, tenant, name="ci \udcff", by="test")
    with pytest.raises(InvalidInput) as session:
        chat.create_session(harness.k, tenant, "why \ud800", None)
    assert [e.value.details[0]["field"] for e in (key, session)] == ["name", "name"]
