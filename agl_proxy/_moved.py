"""Old module paths of agl_proxy, from before its split into subpackages by concern.

`import agl_proxy.token_chain` fails with a message naming `agl_proxy.chain.backend` instead of
a bare "No module named" (`agl_store.moved_modules`).
"""

from __future__ import annotations

from types import MappingProxyType

from agl_store import moved_modules

_MODULES_OF = {
    "common": ("errors", "credentials", "deployments", "metrics"),
    "controls": ("pausing", "sampling"),
    "recording": ("call_record", "sequences", "exporter", "assembly"),
    "backends": ("forwarding", "litellm_path", "balancing", "upstream"),
    "chain": ("engine", "engine_http", "row_budget"),
    "server": ("app", "calls", "answering", "token_count", "auth", "state", "settings", "proxy", "cli"),
}
MOVED = MappingProxyType(
    {
        **{
            f"agl_proxy.{name}": f"agl_proxy.{package}.{name}"
            for package, names in _MODULES_OF.items()
            for name in names
        },
        "agl_proxy.backend": "agl_proxy.backends.base",
        "agl_proxy.token_chain": "agl_proxy.chain.backend",
        "agl_proxy.chain_stream": "agl_proxy.chain.stream",
        "agl_proxy.chain_memory": "agl_proxy.chain.memory",
        "agl_proxy.chain_messages": "agl_proxy.chain.digests",
        "agl_proxy.chain_links": "agl_proxy.chain.links",
        "agl_proxy.chain_heads": "agl_proxy.chain.heads",
    }
)


def install() -> None:
    """Make the old paths fail naming the new ones (the package's `__init__` calls it)."""
    moved_modules.install(MOVED)
