"""Names and ids checked by a pattern are whole: ``$`` also matches before a final newline, so a
label name a model put in a PromQL selector ("env\\n"), or a model id, passed with one. The
patterns end with ``\\Z`` (pydantic's own, a different engine, keep ``$``: there it is the end)."""

from __future__ import annotations

import pytest

from kortex.errors import InvalidInput
from kortex.llm import catalog
from kortex.telemetry.prometheus import PrometheusMetrics


def test_a_label_name_with_a_final_newline_cannot_reach_a_promql_selector() -> None:
    prom = PrometheusMetrics("http://127.0.0.1:9", single_tenant=True)
    try:
        with pytest.raises(InvalidInput):
            prom.selector("t", "checkout", "up", {"env\n": "prod"})
        assert prom.selector("t", "checkout", "up\n", {}).startswith('{__name__="up\\n"')  # quoted, not raw
    finally:
        prom.close()


def test_a_model_id_with_a_final_newline_is_not_valid() -> None:
    assert catalog.valid_id("gpt-4o") and not catalog.valid_id("gpt-4o\n")
