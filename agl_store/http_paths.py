"""Where the store server's own routes live: the client builds its URLs on the same prefix.

Apart from `agl_store.server` so that importing the client does not import the server.
"""

AGL_PREFIX = "/v1/agl"
"""agent-lightning 0.3's prefix of the store routes."""
