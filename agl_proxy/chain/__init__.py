"""The token chain: chat calls served token in, token out on vLLM's token endpoints, each prompt
rendered by the engine or bridged from the model's own earlier ids.

- `backend`: `TokenChainBackend`, a call's way through the chain (render or bridge, generate,
  derender, answer);
- `links`, `digests`, `memory`, `heads`: which earlier call a request continues, how messages
  are compared, the calls remembered per attempt, the bridge's cached head renderings;
- `engine`, `engine_http`: vLLM's token endpoints, found once per deployment, and the lean HTTP
  client that calls them;
- `stream`: a streamed call answered as it is generated;
- `row_budget`: what a call may generate so that its training row stays whole.
"""
