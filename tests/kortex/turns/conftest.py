"""Turns through real provider adapters use the LLM tests' fake server and keep vendor keys out."""

from tests.kortex.llm.conftest import _no_vendor_env, fake  # noqa: F401 (fixtures, shared)
