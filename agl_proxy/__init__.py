"""agl_proxy: the OpenAI-compatible LLMProxy that records token-level spans."""

from .errors import ProxyError
from .proxy import LLMProxy
from .settings import ProxySettings

__all__ = ["LLMProxy", "ProxyError", "ProxySettings"]
