"""The token chain: chat calls served token in, token out, each prompt made from the model's
own earlier tokens where the call continues an earlier one.

Per call: the link to the attempt's earlier calls (`memory`), the prompt ids (the
parent's prompt + its choice's ids + the template's turn close + only the new messages as
the engine renders them after the echoed answer, one small render where the answer shows
where it ends (`echoed_answer_end`, the head's rendering kept in `heads`), two where
not; or the request rendered whole),
`/inference/v1/generate`, and the client's answer made from the generated ids by the
engine's own parsers (`/v1/chat/completions/derender`). A deployment without those
endpoints is served by the pass-through, and its spans say so.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import httpx
import orjson
from starlette.types import Receive

from ..backends.base import Call, RequestOptions, request_fields
from ..backends.forwarding import PassthroughBackend, backend_headers
from ..common.deployments import Deployment
from ..common.errors import BadRequestError
from ..controls.sampling import MAX_TOKENS_ALIASES
from .digests import SYSTEM_ROLES
from .engine import (
    DERENDER,
    GENERATE,
    RENDER,
    Engine,
    EngineProbes,
    EngineRejected,
    ends_on_stop_token,
    post_json,
)
from .engine_http import EngineHttp
from .heads import ChainHeads, head_key
from .links import ChainEntry, Link
from .memory import ChainMemory, chain_entry
from .row_budget import fit_row
from .stream import SSE, ChainStream, StreamFailed, sse_chunks

T = TypeVar("T")
_SAMPLING_PARAMS_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default."""
_DUMMY_USER = {"role": "user", "content": "."}
_MAX_HEADER = 32
"""The most ids an assistant turn's header (role, channel, think opener) is looked for in."""
_JSON = [(b"content-type", b"application/json")]


def chat_body(body: Mapping[str, Any], deployment: Deployment, options: RequestOptions) -> dict[str, Any]:
    """The chat request as the engine renders it: the client's fields over the deployment's
    defaults, under the proxy's overrides, logprobs asked for when the proxy wants them."""
    out = request_fields(body, deployment.request_defaults, options)
    out["model"] = deployment.model
    if options.logprobs and out.get("logprobs") in (None, False):
        out["logprobs"] = True
    return out


def take_limit(body: dict[str, Any], max_model_len: int | None) -> tuple[dict[str, Any], int | None]:
    """The request to render, without its token limit where the model's context is known, and
    that limit; the call generates at most the limit and what the context leaves after its prompt
    (`Prompt.within_context`). A limit that is not a positive integer stays, for vLLM's render to
    refuse by name; `body` itself, which the span keeps, is left as the client sent it.

    vLLM reserves a request's limit for the output before it reads the prompt, and refuses a
    prompt that does not fit in the rest (by its characters, before tokenizing). Agents size the
    limit for the models they were written for (Claude Code asks for 64,000 or 128,000 tokens), so
    against a smaller context their calls would be refused."""
    if max_model_len is None:
        return body, None
    given = [body[name] for name in MAX_TOKENS_ALIASES if body.get(name) is not None]
    if not given or any(type(limit) is not int or limit < 1 for limit in given):
        return body, None
    # vLLM's order: max_completion_tokens over the legacy max_tokens.
    return {name: value for name, value in body.items() if name not in MAX_TOKENS_ALIASES}, given[-1]


@dataclass(frozen=True, slots=True)
class Prompt:
    """What generate is called with, and the chat request derender parses the answer with."""

    link: Link
    token_ids: list[int]
    stored: array[int] | None
    """`token_ids` as the chain keeps them, where they were made from kept ids (a bridge's)."""
    render: dict[str, Any]
    """The render endpoint's answer (sampling params, request id) for the request below."""
    chat_request: dict[str, Any]

    def within_context(self, limit: int, max_model_len: int) -> Prompt:
        """This prompt generating at most `limit` tokens and what the model's context leaves after it."""
        sampling = self.render["sampling_params"]
        room = min(sampling.get("max_tokens", limit), max_model_len - len(self.token_ids))
        sampling = {**sampling, "max_tokens": max(1, min(limit, room))}
        return replace(self, render={**self.render, "sampling_params": sampling})


def bridge_requests(body: Mapping[str, Any], new_from: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two small requests whose renderings differ by exactly what follows the echoed answer:
    (system, a dummy user turn, the echoed answer, the new messages; with the request's own
    generation prompt) and the same without the new messages or a generation prompt (whose
    messages but the last are the head `heads` keeps)."""
    messages = body["messages"]
    head = [messages[0]] if isinstance(messages[0], Mapping) and messages[0].get("role") in SYSTEM_ROLES else []
    head += [_DUMMY_USER, messages[new_from - 1]]
    full = {**body, "messages": head + list(messages[new_from:])}
    base = {**body, "messages": head, "add_generation_prompt": False, "continue_final_message": False}
    return full, base


def echoed_answer_end(
    full_ids: list[int], head: Sequence[int], parent_prompt: Any, response_ids: Any, close: tuple[int, ...]
) -> int | None:
    """Where the echoed answer's turn ends in `full_ids` (the head, the echoed answer, the new
    messages) when the engine rendered that answer as the very ids it was sampled as; None otherwise.

    `full_ids` must start with `head` (the system message and the dummy user turn rendered alone).
    The answer's turn is then the ids its prompt ended with (the assistant header, as generate was
    given it), the sampled ids without their stop id, and `close`, found at the first place past the
    head where the sampled ids and the close are; anything else (a template that renders the answer
    otherwise, as Qwen3 drops an earlier turn's reasoning, or tool calls written differently) is
    None, and the bridge renders the echoed answer alone to see where it ends."""
    n = len(head)
    if len(full_ids) <= n or full_ids[:n] != list(head):
        return None
    answer = list(response_ids[:-1] if len(response_ids) and response_ids[-1] == close[0] else response_ids)
    if not answer:
        return None
    turn = [*answer, *close]
    first = answer[0]
    for at in range(n + 1, min(n + 1 + _MAX_HEADER, len(full_ids) - len(turn) + 1)):
        if full_ids[at] == first and full_ids[at : at + len(turn)] == turn:
            header = full_ids[n:at]
            if list(parent_prompt[-len(header) :]) == header:
                return at + len(turn)
            return None
    return None


def turn_glue(response_ids: Any, close: tuple[int, ...]) -> list[int]:
    """What follows a sampled answer before the next turn: the template's close, without its
    first id when the model sampled that itself (a cut or otherwise stopped answer gets it all)."""
    if len(response_ids) and response_ids[-1] == close[0]:
        return list(close[1:])
    return list(close)


def new_messages_start(
    full_ids: list[int], base_ids: list[int], close: tuple[int, ...], close_text: str, echoed: Any
) -> int | None:
    """Where the new messages start in `full_ids` (the echoed answer then the new messages),
    `base_ids` being the echoed answer alone; None when the renderings do not show it.

    Where the base is a prefix, they start after it. A template may render its last answer
    otherwise (Qwen3 gives the last one an empty think block): then the echoed answer's turn ends
    at the first `close` past what the renderings share, provided the answer's own text holds no
    `close_text` (which would be that close instead)."""
    if not close or tuple(base_ids[-len(close) :]) != close:
        return None
    if len(full_ids) > len(base_ids) and full_ids[: len(base_ids)] == base_ids:
        return len(base_ids)
    if not close_text or close_text in orjson.dumps(echoed).decode():
        return None
    shared = 0
    while shared < min(len(full_ids), len(base_ids)) and full_ids[shared] == base_ids[shared]:
        shared += 1
    width = len(close)
    for at in range(shared, len(full_ids) - width):
        if tuple(full_ids[at : at + width]) == close:
            return at + width
    return None


class TokenChainBackend:
    """Serves chat calls from a vLLM deployment through its token-in endpoints."""

    __slots__ = ("client", "deployment", "heads", "memory", "probes", "transport")

    def __init__(
        self,
        client: httpx.AsyncClient,
        transport: EngineHttp,
        deployment: Deployment,
        memory: ChainMemory,
        probes: EngineProbes,
        heads: ChainHeads,
    ) -> None:
        self.client = client
        self.heads = heads
        self.transport = transport
        self.deployment = deployment
        self.memory = memory
        self.probes = probes

    async def serve(self, call: Call) -> None:
        engine = await self.probes.engine(self.client, self.transport, self.deployment)
        if engine is None:
            # Its span's chain says `backend_renders` (no chain set).
            await PassthroughBackend(self.client, self.deployment, "chat").serve(call)
            return
        record = call.record
        body = chat_body(call.body, self.deployment, call.options)
        record.deployment = self.deployment
        record.request = body
        body, limit = take_limit(body, engine.max_model_len)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages must be a non-empty list of chat messages")
        headers = backend_headers(self.deployment, record.rollout_id, record.attempt_id)
        stream: ChainStream | None = None
        try:
            link, keys = await self.memory.link(record.rollout_id, record.attempt_id, body)
            prompt = await self._prompt(engine, body, headers, link)
            if limit is not None and engine.max_model_len is not None:
                prompt = prompt.within_context(limit, engine.max_model_len)
            # The row budget (row_budget.py): the cap by what the call's training row still holds.
            row = fit_row(prompt.link, len(prompt.token_ids), call.row_tokens)
            prompt = replace(prompt, link=row.link, render=row.capped_render(prompt.render))
            record.row = row.attributes(prompt.render)
            # vLLM 0.31's streamed generate fails for n > 1 (an IndexError in its stream
            # generator): those calls get their stream once the answer is whole.
            if body.get("stream") and (prompt.render["sampling_params"].get("n") or 1) == 1:
                stream = ChainStream(call, self.transport, self.deployment, headers, prompt.token_ids)
            response = await until_client_leaves(call.receive, self._answer(engine, prompt, headers, stream))
        except EngineRejected as exc:
            record.fail("backend_rejected", exc.message, exc.status)
            await call.send({"type": "http.response.start", "status": exc.status, "headers": _JSON})
            await call.send({"type": "http.response.body", "body": exc.data})
            return
        except StreamFailed as exc:
            assert stream is not None
            record.chain = prompt.link.attribute()
            record.fail(exc.error_type, exc.message, exc.status)
            await stream.fail(exc)
            return
        record.chain = prompt.link.attribute()
        if response is None:
            record.fail("client_disconnected", "the client went away before its answer; generation stopped", 499)
            return
        record.response = response
        record.status_code = 200
        self.memory.remember(
            record.rollout_id,
            record.attempt_id,
            chain_entry(
                record.span_id,
                keys,
                prompt.stored if prompt.stored is not None else prompt.token_ids,
                [(c["token_ids"], c["message"]) for c in response["choices"]],
                row.root_prompt_len,
            ),
        )
        if stream is not None:
            await stream.finish(response)
        elif body.get("stream"):
            await _send_whole_stream(call, response, body)
        else:
            await call.send({"type": "http.response.start", "status": 200, "headers": _JSON})
            await call.send({"type": "http.response.body", "body": orjson.dumps(response)})

    async def _prompt(self, engine: Engine, body: dict[str, Any], headers: Mapping[str, str], link: Link) -> Prompt:
        if link.kind == "bridged" and link.parent is not None and link.choice is not None:
            if not engine.close:
                link = Link("branched", parent=link.parent, cause="template_boundary")
            else:
                bridged = await self._bridge(engine, body, headers, link)
                if bridged is not None:
                    return bridged
                link = Link("branched", parent=link.parent, cause="template_boundary")
        render = await post_json(self.transport, self.deployment, RENDER, body, headers)
        # The render leaves out the sampling fields at SamplingParams' defaults; generate takes
        # an absent max_tokens as "the rest of the context", so it is always sent.
        render["sampling_params"].setdefault("max_tokens", _SAMPLING_PARAMS_MAX_TOKENS)
        ids = list(render["token_ids"])
        if link.kind == "retry" and link.parent is not None:
            ids = list(link.parent.prompt_ids)
        return Prompt(link, ids, None, render, body)

    async def _bridge(
        self, engine: Engine, body: dict[str, Any], headers: Mapping[str, str], link: Link
    ) -> Prompt | None:
        """The bridged prompt, or None when the renderings do not show where the new messages start."""
        assert link.parent is not None and link.choice is not None
        full_request, base_request = bridge_requests(body, link.new_from)
        parent = link.parent
        choice = parent.choices[link.choice]
        response_ids = choice.token_ids
        close = engine.close
        base: dict[str, Any] | None = None
        if choice.answer.reasoning is None:
            full, start = await self._render_bridge(full_request, base_request, headers, parent, response_ids, close)
        else:
            # A template may drop an earlier turn's reasoning (Qwen3): the echoed answer is then
            # not its sampled ids, so it is rendered alone at once.
            full, base = await asyncio.gather(self._render(full_request, headers), self._render(base_request, headers))
            start = None
        if full.get("features"):
            return None
        full_ids = full["token_ids"]
        if start is None:
            if base is None:
                base = await self._render(base_request, headers)
            echoed = body["messages"][link.new_from - 1]
            start = new_messages_start(full_ids, base["token_ids"], close, engine.close_text, echoed)
        if start is None:
            return None
        # Kept ids joined as arrays (a copy of memory), made a list once for the JSON.
        stored = parent.prompt_ids + response_ids + array("l", [*turn_glue(response_ids, close), *full_ids[start:]])
        ids = stored.tolist()
        sampling = dict(full["sampling_params"])
        # The render counted only the small request's prompt against the context.
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        if engine.max_model_len is not None:
            room = engine.max_model_len - len(ids)
            if room < 1:
                raise EngineRejected(
                    400,
                    orjson.dumps(
                        {
                            "error": {
                                "message": f"the prompt is {len(ids)} tokens; the model's context is "
                                f"{engine.max_model_len}",
                                "type": "BadRequestError",
                                "code": 400,
                            }
                        }
                    ),
                    f"backend {self.deployment.label}: the bridged prompt of {len(ids)} tokens exceeds the context",
                )
            sampling["max_tokens"] = min(requested, room) if isinstance(requested, int) else room
        else:
            sampling["max_tokens"] = requested if isinstance(requested, int) else _SAMPLING_PARAMS_MAX_TOKENS
        return Prompt(link, ids, stored, {**full, "sampling_params": sampling}, full_request)

    async def _render_bridge(
        self,
        full_request: dict[str, Any],
        base_request: dict[str, Any],
        headers: Mapping[str, str],
        parent: ChainEntry,
        response_ids: Any,
        close: tuple[int, ...],
    ) -> tuple[dict[str, Any], int | None]:
        """The small request's rendering, and where its new messages start when the echoed answer
        shows it (`echoed_answer_end`); the head's rendering comes from `heads`, or is rendered
        alongside on its first use."""
        head_request = {**base_request, "messages": base_request["messages"][:-1]}
        key = head_key(self.deployment.key, head_request)
        head: Sequence[int] | None = self.heads.get(key)
        if head is None:
            full, rendered = await asyncio.gather(
                self._render(full_request, headers), self._render(head_request, headers)
            )
            head = rendered["token_ids"]
            if not rendered.get("features"):
                self.heads.put(key, head)
        else:
            full = await self._render(full_request, headers)
        return full, echoed_answer_end(full["token_ids"], head, parent.prompt_ids, response_ids, close)

    async def _render(self, request: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        return await post_json(self.transport, self.deployment, RENDER, request, headers)

    async def _answer(
        self, engine: Engine, prompt: Prompt, headers: Mapping[str, str], stream: ChainStream | None
    ) -> dict[str, Any]:
        """The chat answer; with `stream`, the client is streamed it as it is generated."""
        render = prompt.render
        generate_body = {
            "request_id": render.get("request_id"),
            "model": self.deployment.model,
            "token_ids": prompt.token_ids,
            "sampling_params": render["sampling_params"],
            "features": render.get("features") if prompt.link.kind != "bridged" else None,
            "cache_salt": render.get("cache_salt"),
            "priority": render.get("priority", 0),
            "stream": False,
        }
        chat_request = {**{k: v for k, v in prompt.chat_request.items() if k != "stream_options"}, "stream": False}
        if stream is None:
            generated = await post_json(self.transport, self.deployment, GENERATE, generate_body, headers)
        else:
            generated = await stream.relay(self.client, generate_body, chat_request)
        sampling = render["sampling_params"]
        derender_body = {
            "model": self.deployment.model,
            "generate_response": shown_answer(generated, sampling),
            "prompt_tokens": len(prompt.token_ids),
            "chat_request": chat_request,
        }
        response = await post_json(self.transport, self.deployment, DERENDER, derender_body, headers)
        response["prompt_token_ids"] = prompt.token_ids
        sampled_choices = generated.get("choices") or ()
        for choice, sampled in zip(response.get("choices") or (), sampled_choices, strict=False):
            ids = sampled.get("token_ids")
            # The span and the chain keep every sampled id, the stop id too (the trainer trains on it).
            choice["token_ids"] = ids
            if len(ids or ()) == 1 and ends_on_stop_token(ids, sampled.get("finish_reason"), sampling):
                # The answer is its stop token alone: no text, as the chat endpoint parses "".
                choice["message"].update(content="", reasoning=None)
                choice["message"].pop("tool_calls", None)
            # As vLLM's chat endpoint says it: an answer the tool parser found calls in.
            if choice.get("finish_reason") == "stop" and (choice.get("message") or {}).get("tool_calls"):
                choice["finish_reason"] = "tool_calls"
        usage = response.get("usage")
        if isinstance(usage, dict):
            # The derender counted the ids it was given, without the stop ids.
            usage["completion_tokens"] = sum(len(c.get("token_ids") or ()) for c in sampled_choices)
            usage["total_tokens"] = usage["completion_tokens"] + len(prompt.token_ids)
        if stream is not None:
            stream.pin_tool_call_ids(response)
        return response


def shown_answer(generated: Mapping[str, Any], sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The generated answer as the derender is given it: each choice without the stop id whose
    text vLLM's chat endpoint leaves out (`ends_on_stop_token`). A choice that is its stop id alone
    keeps it (the derender refuses a choice without ids), and `_answer` empties its message."""
    choices = []
    for choice in generated.get("choices") or ():
        ids = choice.get("token_ids") or []
        if len(ids) > 1 and ends_on_stop_token(ids, choice.get("finish_reason"), sampling_params):
            choice = {**choice, "token_ids": ids[:-1]}
        choices.append(choice)
    return {**generated, "choices": choices}


async def until_client_leaves(receive: Receive | None, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None once the client went away first (`work` cancelled: the engine
    request's connection closes, and vLLM aborts the generation, as it does for any client)."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    # The request body is read, so the next ASGI message is the client's disconnect.
    watcher = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task in done else None
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _send_whole_stream(call: Call, response: dict[str, Any], body: Mapping[str, Any]) -> None:
    await call.send({"type": "http.response.start", "status": 200, "headers": SSE})
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    for data in sse_chunks(response, include_usage):
        await call.send({"type": "http.response.body", "body": data, "more_body": True})
        if call.record.ttft_s is None:
            call.record.ttft_s = time.perf_counter() - call.t0
    await call.send({"type": "http.response.body", "body": b"", "more_body": False})
