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

from ..backends.base import Call, RequestOptions, RetryableBackendError, request_fields
from ..backends.forwarding import PassthroughBackend, backend_headers
from ..common.deployments import Deployment
from ..common.errors import BadRequestError, ProxyError
from ..controls.sampling import MAX_TOKENS_ALIASES
from .bridging import (
    bridge_requests,
    echoed_answer_end,
    keeps_head,
    new_messages_start,
    parent_reasoning_requests,
    reasoning_requests,
    turn_glue,
)
from .continuation import Sampler, Segments, generate_continuing
from .digests import reasoning_of
from .engine import (
    DERENDER,
    GENERATE,
    RENDER,
    Engine,
    EngineProbes,
    EngineRejected,
    detokenize,
    ends_on_stop_token,
    post_json,
)
from .engine_http import EngineHttp
from .heads import ChainHeads, head_key
from .links import Link
from .memory import ChainMemory, chain_entry
from .rebuild import REBUILT_CAUSES, UNPROVEN, rebuild
from .row_budget import fit_row
from .stops import cut_at_stop_string, stop_strings, stop_token_reason
from .stream import SSE, ChainStream, StreamFailed, sse_chunks, stream_failure
from .tool_call_ids import name_tool_calls

T = TypeVar("T")
_SAMPLING_PARAMS_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default."""
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
        current = call.current

        def version() -> str | None:
            """The weight version the replica serves now: a weight update may land mid-call."""
            return (self.deployment if current is None else current(self.deployment)).model_version

        sampler = Sampler(self.client, self.deployment, headers, call.handle, version)

        # A replica tried before this one may have set it.
        record.chain = None
        try:
            link, keys = await self.memory.link(
                record.rollout_id, record.attempt_id, body, self.deployment.request_defaults
            )
            # A call that fails from here on is a chain call: its span says how its prompt was being made.
            record.chain = link.attribute()
            prompt = await self._prompt(engine, body, headers, link)
            if limit is not None and engine.max_model_len is not None:
                prompt = prompt.within_context(limit, engine.max_model_len)
            # The row budget (row_budget.py): the cap by what the call's training row still holds.
            row = fit_row(prompt.link, len(prompt.token_ids), call.row_tokens)
            prompt = replace(prompt, link=row.link, render=row.capped_render(prompt.render))
            record.row = row.attributes(prompt.render)
            # vLLM 0.31's streamed generate fails for n > 1 (an IndexError in its stream
            # generator), and a stop string's text, which vLLM's chat stream holds back and
            # leaves out, cannot be taken back once streamed: those calls get their stream
            # once the answer is whole.
            sampling = prompt.render["sampling_params"]
            if body.get("stream") and (sampling.get("n") or 1) == 1 and not stop_strings(sampling):
                stream = ChainStream(call, self.transport, self.deployment, headers, prompt.token_ids, sampler)
            record.chain = prompt.link.attribute()
            answered = await until_client_leaves(call.receive, self._answer(engine, prompt, headers, stream, sampler))
        except (EngineRejected, RetryableBackendError, ProxyError, StreamFailed) as exc:
            if stream is not None and stream.started:
                # The client's answer has begun: it ends with an error event, never a second start,
                # and the call is not sent to another replica (it was generated here).
                failed = exc if isinstance(exc, StreamFailed) else stream_failure(exc)
                record.fail(failed.error_type, failed.message, failed.status)
                await stream.fail(failed)
                return
            if not isinstance(exc, EngineRejected):
                raise
            record.fail("backend_rejected", exc.message, exc.status)
            await call.send({"type": "http.response.start", "status": exc.status, "headers": _JSON})
            await call.send({"type": "http.response.body", "body": exc.data})
            return
        if answered is None:
            record.fail("client_disconnected", "the client went away before its answer; generation stopped", 499)
            return
        response, record.segments = answered
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
        seen: array[int] | None = None
        if link.kind == "bridged" and link.parent is not None and link.choice is not None:
            bridged = await self._bridge(engine, body, headers, link) if engine.close else "template_boundary"
            if isinstance(bridged, Prompt):
                return bridged
            if bridged in REBUILT_CAUSES:
                # The template renders the history otherwise: the prompt is its rendering, rebuilt
                # from the ids the parent was given and sampled where it writes the same text.
                seen = link.parent.prompt_ids + link.parent.choices[link.choice].token_ids
            link = Link("branched", parent=link.parent, cause=bridged)
        render = await post_json(self.transport, self.deployment, RENDER, body, headers)
        # The render leaves out the sampling fields at SamplingParams' defaults; generate takes
        # an absent max_tokens as "the rest of the context", so it is always sent.
        sampling = render["sampling_params"]
        sampling.setdefault("max_tokens", _SAMPLING_PARAMS_MAX_TOKENS)
        ids = list(render["token_ids"])
        if link.kind == "retry" and link.parent is not None:
            ids = list(link.parent.prompt_ids)
        elif seen is not None:
            rebuilt = await rebuild(
                ids,
                seen,
                engine.close,
                engine.close_text,
                lambda some: detokenize(self.transport, self.deployment, headers, some),
            )
            if rebuilt is None:
                link = replace(link, cause=UNPROVEN)
            else:
                ids = rebuilt
                if engine.max_model_len is not None:
                    # The render sized the answer for its own prompt, which may be a few ids shorter.
                    sampling["max_tokens"] = max(1, min(sampling["max_tokens"], engine.max_model_len - len(ids)))
        return Prompt(link, ids, None, render, body)

    async def _bridge(
        self, engine: Engine, body: dict[str, Any], headers: Mapping[str, str], link: Link
    ) -> Prompt | str:
        """The bridged prompt, or the cause of rendering the call whole: the renderings do not show
        that the template renders the history the same once the new messages follow (`bridging`),
        or where the new messages start."""
        assert link.parent is not None and link.choice is not None
        full_request, base_request = bridge_requests(body, link.new_from)
        parent = link.parent
        choice = parent.choices[link.choice]
        response_ids = choice.token_ids
        close = engine.close
        reasoning = choice.answer.reasoning is not None
        # A template often renders an answer with reasoning otherwise than it was sampled (Qwen3
        # gives the last answer its think block, and drops it at a new user turn): its rendering
        # alone is asked for at once.
        full, head, base = await self._render_bridge(full_request, base_request, headers, with_base=reasoning)
        if full.get("features"):
            return "template_boundary"
        full_ids = full["token_ids"]
        if not keeps_head(full_ids, head):
            return "template_rewrites_history"
        start = echoed_answer_end(full_ids, head, parent.prompt_ids, response_ids, close)
        if not self.deployment.keep_reasoning:
            dropped = await self._reasoning_cause(body, link, headers, shown=start is not None and reasoning)
            if dropped is not None:
                return dropped
        if start is None:
            if base is None:
                base = await self._render(base_request, headers)
            base_ids = base["token_ids"]
            if not keeps_head(base_ids, head):
                return "template_rewrites_history"
            if full_ids[: len(base_ids)] != base_ids:
                # The template renders the echoed answer otherwise once more follows (Qwen3's
                # think block, empty or not, goes from an answer before the last user message).
                if not self.deployment.keep_reasoning:
                    return "template_rewrites_history"
                if reasoning:
                    link = replace(link, cause="reasoning_kept")
            echoed = body["messages"][link.new_from - 1]
            start = new_messages_start(full_ids, base_ids, close, engine.close_text, echoed)
            if start is None:
                return "template_boundary"
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
        elif isinstance(requested, int):
            sampling["max_tokens"] = requested
        else:
            # The context's length unknown, generate sizes the answer as vLLM's chat endpoint does:
            # what the context leaves after this prompt (the small render sized it for its own).
            sampling.pop("max_tokens", None)
        return Prompt(link, ids, stored, {**full, "sampling_params": sampling}, full_request)

    async def _render_bridge(
        self, full_request: dict[str, Any], base_request: dict[str, Any], headers: Mapping[str, str], with_base: bool
    ) -> tuple[dict[str, Any], Sequence[int], dict[str, Any] | None]:
        """The small request's rendering, the head's (from `heads`, or rendered alongside on its
        first use) and, `with_base`, the echoed answer's alone, rendered alongside."""
        head_request = {**base_request, "messages": base_request["messages"][:-1]}
        key = head_key(self.deployment.key, head_request)
        head: Sequence[int] | None = self.heads.get(key)
        renders = [self._render(full_request, headers)]
        if head is None:
            renders.append(self._render(head_request, headers))
        if with_base:
            renders.append(self._render(base_request, headers))
        rendered = await asyncio.gather(*renders)
        if head is None:
            head = rendered[1]["token_ids"]
            if not rendered[1].get("features"):
                self.heads.put(key, head)
        return rendered[0], head, rendered[-1] if with_base else None

    async def _reasoning_cause(
        self, body: dict[str, Any], link: Link, headers: Mapping[str, str], shown: bool
    ) -> str | None:
        """Why a bridge would keep reasoning the template does not render, for a deployment whose
        prompts follow the template: `reasoning_dropped` (the client did not send the answer's
        reasoning back, so the template renders its turn without it), `template_drops_reasoning`
        (the template drops the reasoning since the last user message once the new messages follow,
        as Qwen3's does at a new user turn); None when it renders that reasoning. `shown`: the
        echoed answer, reasoning and all, is rendered as the very ids it was sampled as."""
        assert link.parent is not None and link.choice is not None
        echoed_reasoning = reasoning_of(body["messages"][link.new_from - 1])
        if link.parent.choices[link.choice].answer.reasoning is not None:
            if not echoed_reasoning:
                return "reasoning_dropped"
            if shown:
                return None
        requests = reasoning_requests(body, link.new_from)
        if requests is None:
            return None
        if not echoed_reasoning:
            # Only earlier answers carry reasoning: the bridge keeps it only where the parent's prompt showed it.
            before = parent_reasoning_requests(body, link.new_from)
            if before is None or await self._render_equal(before, headers):
                return None
        return "template_drops_reasoning" if await self._render_equal(requests, headers) else None

    async def _render_equal(self, requests: tuple[dict[str, Any], dict[str, Any]], headers: Mapping[str, str]) -> bool:
        """Whether the template renders the two requests as the same ids."""
        one, other = await asyncio.gather(*(self._render(request, headers) for request in requests))
        return bool(one["token_ids"] == other["token_ids"])

    async def _render(self, request: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        return await post_json(self.transport, self.deployment, RENDER, request, headers)

    async def _answer(
        self,
        engine: Engine,
        prompt: Prompt,
        headers: Mapping[str, str],
        stream: ChainStream | None,
        sampler: Sampler,
    ) -> tuple[dict[str, Any], dict[int, Segments]]:
        """The chat answer and its choices' segments (`continuation`); with `stream`, the client is
        streamed it as it is generated. A generation a weight update stops is continued after it
        where it streams from the engine: streamed calls, and all calls of a deployment with
        `continue_generations`."""
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
        if stream is not None:
            generated = await stream.relay(generate_body, chat_request)
            segments = stream.segments
        elif self.deployment.continue_generations:
            generated, segments = await generate_continuing(sampler, generate_body)
        else:
            sampled_by = sampler.version()
            generated = await post_json(self.transport, self.deployment, GENERATE, generate_body, headers)
            segments = {
                c["index"]: [(sampled_by, len(c.get("token_ids") or ()))] for c in generated.get("choices") or ()
            }
        sampling = render["sampling_params"]
        shown = shown_answer(generated, sampling)
        response = await self._derender(prompt, shown, chat_request, headers)
        sampled_choices = generated.get("choices") or ()
        choices = response.get("choices") or []
        unshown: list[dict[str, Any]] = []
        for choice, sampled in zip(choices, sampled_choices, strict=False):
            ids = sampled.get("token_ids") or []
            # The span and the chain keep every sampled id, the stop id too (the trainer trains on it).
            choice["token_ids"] = ids
            choice["stop_reason"] = None
            if sampled.get("finish_reason") != "stop":
                continue
            if ends_on_stop_token(ids, "stop", sampling):
                choice["stop_reason"] = stop_token_reason(ids, sampling)
                if len(ids) == 1:
                    unshown.append(choice)
            elif stop_strings(sampling):
                choice["stop_reason"] = cut_at_stop_string(choice["message"], sampling)
                if choice["stop_reason"] is None:
                    # No stop string in its text: the answer ended on the end-of-sequence id,
                    # whose text the derender showed and the chat endpoint leaves out.
                    unshown.append(choice)
        await self._derender_without_stop_ids(prompt, shown, unshown, chat_request, headers)
        for choice in choices:
            # As vLLM's chat endpoint says it: an answer the tool parser found calls in.
            if choice.get("finish_reason") == "stop" and (choice.get("message") or {}).get("tool_calls"):
                choice["finish_reason"] = "tool_calls"
        response["prompt_token_ids"] = prompt.token_ids
        usage = response.get("usage")
        if isinstance(usage, dict):
            # The derender counted the ids it was given, without the stop ids.
            usage["completion_tokens"] = sum(len(c.get("token_ids") or ()) for c in sampled_choices)
            usage["total_tokens"] = usage["completion_tokens"] + len(prompt.token_ids)
        # The ids vLLM's chat endpoint gives; a stream's calls keep those the client was streamed.
        name_tool_calls(response, chat_request, self.deployment.tool_call_ids)
        if stream is not None:
            stream.pin_tool_call_ids(response)
        return response, segments

    async def _derender(
        self, prompt: Prompt, generated: Mapping[str, Any], chat_request: Mapping[str, Any], headers: Mapping[str, str]
    ) -> dict[str, Any]:
        body = {
            "model": self.deployment.model,
            "generate_response": generated,
            "prompt_tokens": len(prompt.token_ids),
            "chat_request": chat_request,
        }
        return await post_json(self.transport, self.deployment, DERENDER, body, headers)

    async def _derender_without_stop_ids(
        self,
        prompt: Prompt,
        shown: Mapping[str, Any],
        choices: list[dict[str, Any]],
        chat_request: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> None:
        """Give `choices` (the derendered answer's, their `token_ids` the sampled ids) the messages of
        their ids without the last, a stop id: derendered again, or, for an answer that is its stop id
        alone, no text (as the chat endpoint parses "")."""
        again = {c["index"]: c["token_ids"][:-1] for c in choices if len(c["token_ids"]) > 1}
        for choice in choices:
            if choice["index"] not in again:
                choice["message"].update(content="", reasoning=None)
                choice["message"].pop("tool_calls", None)
        if not again:
            return
        generated = {
            **shown,
            "choices": [
                {**c, "token_ids": again[c["index"]]} for c in shown.get("choices") or () if c["index"] in again
            ],
        }
        derendered = await self._derender(prompt, generated, chat_request, headers)
        messages = {c["index"]: c["message"] for c in derendered.get("choices") or ()}
        for choice in choices:
            if choice["index"] in messages:
                choice["message"] = messages[choice["index"]]


def shown_answer(generated: Mapping[str, Any], sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The generated answer as the derender is given it: each choice without the stop id whose
    text vLLM's chat endpoint leaves out (`ends_on_stop_token`). A choice that is its stop id alone
    keeps it (the derender refuses a choice without ids), and `_answer` gives it no text."""
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
