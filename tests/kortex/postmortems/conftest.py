"""Post-mortem turns through a real provider adapter use the LLM tests' fake server."""

from tests.kortex.llm.conftest import _no_vendor_env, fake  # noqa: F401 (fixtures, shared)
