"""agl_proxy: the OpenAI-compatible LLMProxy that records token-level spans.

The layout is the architecture (docs/architecture.md), each subpackage importing only those
before it:

- `common`: errors, deployments and their credentials, metrics: what every layer shares;
- `controls`: what the trainer sets on the proxy: the pause gate, sampling by mode;
- `recording`: one call recorded (`CallRecord`), its sequence number, its span exported;
- `translate`: the Responses and Messages APIs over chat completions;
- `backends`: the one interface a call is served through, the pass-through, LiteLLM, replicas;
- `chain`: the token chain: prompts rendered or bridged from the model's own ids, token in, token out;
- `server`: the front door: the ASGI app and its routes, settings, `LLMProxy`, `agl proxy serve`.

Import `LLMProxy`, `ProxySettings` and `ProxyError` from here. A module's old path from before
this layout (`agl_proxy.token_chain`) fails with an ImportError naming its new one (`_moved`).
"""

from . import _moved
from .common.errors import ProxyError
from .server.proxy import LLMProxy
from .server.settings import ProxySettings

_moved.install()

__all__ = ["LLMProxy", "ProxyError", "ProxySettings"]
