"""agl_proxy: the OpenAI-compatible LLMProxy that records token-level spans."""

from .errors import ProxyError
from .proxy import LLMProxy
from .spans import LLM_CALL_SPAN_NAME

__all__ = ["LLM_CALL_SPAN_NAME", "LLMProxy", "ProxyError"]
