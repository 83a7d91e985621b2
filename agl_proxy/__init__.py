"""agl_proxy: the OpenAI-compatible LLMProxy that records token-level spans."""
