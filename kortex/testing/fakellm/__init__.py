"""A fake LLM server speaking the Anthropic, OpenAI and Ollama wire formats, for tests and benchmarks."""

from kortex.testing.fakellm.script import FakeCall, FakeFault, FakeScript, FakeStep, FakeStreamError, FakeUsage
from kortex.testing.fakellm.server import FakeLLM, Recorded

__all__ = ["FakeCall", "FakeFault", "FakeLLM", "FakeScript", "FakeStep", "FakeStreamError", "FakeUsage",
           "Recorded"]
