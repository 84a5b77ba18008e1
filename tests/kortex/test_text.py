"""Text as PostgreSQL can store it: NUL and lone surrogates refused from callers, replaced in
what a model writes. Names, one line each: control characters refused too."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kortex.errors import InvalidInput
from kortex.text import REPLACEMENT, Name, Storable, check_name, check_storable, one_line, storable


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


@pytest.mark.parametrize("value,code", [
    ("\x1b[31mred", "U+001B"), ("a\nb", "U+000A"), ("a\rb", "U+000D"), ("tab\there", "U+0009"), ("\x07", "U+0007"),
    ("del\x7f", "U+007F"), ("csi\x9b2J", "U+009B"), ("nel\x85", "U+0085"), ("trailing\n", "U+000A"),
    ("line\u2028sep", "U+2028"), ("para\u2029sep", "U+2029"), ("invoice\u202egpj.exe", "U+202E"),
    ("isolate\u2066x\u2069", "U+2066"),
])
def test_a_control_character_in_a_name_is_refused_naming_the_field_and_the_character(value: str, code: str) -> None:
    message = f"contains a control character ({code}): a name is one line of printable text"
    with pytest.raises(InvalidInput) as refused:
        check_name(value, "name")
    assert refused.value.code == "validation"
    assert refused.value.details == [{"field": "name", "message": message}]
    assert value not in refused.value.message  # the refusal does not echo the escape sequence it refuses

    class Body(BaseModel):
        name: Name

    with pytest.raises(ValidationError) as invalid:
        Body(name=value)
    assert message in str(invalid.value)


@pytest.mark.parametrize("value,message", [
    ("a\x00b", "contains a NUL character"),
    ("\udcff", "is not valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"),
])
def test_a_name_is_storable_text_first(value: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_name(value, "name")
    assert refused.value.details == [{"field": "name", "message": message}]


@pytest.mark.parametrize("value", ["plain", "caf\u00e9 \U0001F600 \u4e2d", "no\u00a0break", " padded ", "", None])
def test_printable_names_pass(value: str | None) -> None:
    check_name(value, "name")


def test_free_text_becomes_a_name_on_one_line() -> None:
    assert one_line("  why is\n\tcheckout \x1b[31mslow?\r\n") == "why is checkout [31mslow?"
    assert one_line("caf\u00e9 \U0001F600") == "caf\u00e9 \U0001F600"
    assert one_line("\x07\x9b") == ""
    assert one_line("a\u2028b\u202ec") == "a b c"
    check_name(one_line("a\x85b\x00c\ud800"), "name")  # whatever it is given, what it returns is a name


def test_the_domains_name_entry_points_refuse_control_characters(harness) -> None:  # type: ignore[no-untyped-def]
    from kortex import keys
    from kortex.turns import checkpoints

    tenant = harness.tenant("acme")
    before = keys.list_keys(harness.k, tenant)
    with pytest.raises(InvalidInput) as key:
        keys.create_key(harness.k, tenant, name="ci\x1b]0;pwned\x07", by="test")
    with pytest.raises(InvalidInput) as blank:
        keys.create_key(harness.k, tenant, name="   ", by="test")
    assert keys.list_keys(harness.k, tenant) == before
    turn = harness.ask(tenant, "why is checkout slow?")
    with pytest.raises(InvalidInput) as fork:
        checkpoints.fork(harness.k, tenant, turn.session_id, checkpoints.checkpoint_id(turn.id, None), "a\nb")
    with pytest.raises(InvalidInput) as made:
        keys.create_tenant(harness.k, "acme\x1b[2J", by="test")
    with pytest.raises(InvalidInput) as spaced:
        keys.create_tenant(harness.k, "acme/2", by="test")  # refused before too, but naming no field
    assert [e.value.details[0]["field"] for e in (key, blank, fork, made, spaced)] == ["name"] * 5
    assert blank.value.details[0]["message"] == "is blank: give the key a name, or none for 'default'"
    with pytest.raises(Exception) as gone:
        keys.tenant_by_name(harness.k, "acme\x1b[2J")
    assert type(gone.value).__name__ == "NotFound"  # nothing was made
