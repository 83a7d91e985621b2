"""How a call reaches a model: the one `Backend` interface every call is served through, agl's
pass-through to OpenAI-compatible servers (vLLM), LiteLLM for the others, choosing a replica,
and the HTTP client they share. The token chain (`chain`) is a backend built on these."""
