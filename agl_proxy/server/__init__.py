"""The proxy's front door: the ASGI app and its routes, a call's endpoint from admission to
answer, authentication, the shared state one proxy holds, its settings, `LLMProxy` and
`agl proxy serve`."""
