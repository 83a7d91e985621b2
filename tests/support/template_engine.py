"""An in-process engine that serves vLLM's token endpoints for any chat template: a proxy's token
chain can be driven through templates vLLM cannot load for the tiny model cheaply.

It serves what the proxy's chain calls (`agl_proxy/chain/engine.py`), in the shapes vLLM 0.31 gives
them (`vllm/entrypoints/serve/render`, `.../serve/disagg`): `GET /openapi.json` and `/v1/models`,
`POST /v1/chat/completions/render` (the request rendered with transformers' `apply_chat_template`
and the template, tool-call arguments parsed from JSON first as vLLM's `chat_utils` does),
`/inference/v1/generate`, `/v1/chat/completions/derender` and `/detokenize`.

It is no model: each generate answers the next message of `answers` (its tool calls given ids
of nine letters and digits, as Mistral's templates want) as the template writes it after the
generation prompt of the last request rendered with one (the rendering of that request with the
answer appended, from where it leaves the prompt up to and including the template's end-of-turn
token), and the derender gives that message back. The model's
own ids are then exactly what the template renders for them, so a prompt the chain bridges can be
compared with the template's rendering of the whole conversation id for id::

    engine = TemplateEngine(tokenizer, template, end_of_turn="<|im_end|>")
    async with serve(engine) as url:              # an ASGI app; tests/proxy/helpers.py
        engine.answers.append({"role": "assistant", "content": "Sunny."})
        ...                                       # a chat call through a proxy to url + "/v1"
        engine.render_ids(request)                # the template's rendering of a request

`pieces` makes the model sample some text as other ids than the template re-tokenizes it to, and
`detokenizes = False` makes the engine refuse `/detokenize`.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

PATHS = ("/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender")
MAX_MODEL_LEN = 32_768


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a template: tool-call arguments parsed, `None` content as
    "", reasoning under both of its names."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        if reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning
        if message.get("tool_calls"):
            message["tool_calls"] = [_parsed_call(call) for call in message["tool_calls"]]
        out.append(message)
    return out


def _parsed_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = json.loads(function["arguments"] or "{}")
    return {**call, "function": function}


def _replaced(ids: list[int], run: list[int], by: list[int]) -> list[int]:
    """`ids` with every occurrence of `run` replaced by `by`."""
    out, at = [], 0
    while at < len(ids):
        if ids[at : at + len(run)] == run:
            out += by
            at += len(run)
        else:
            out.append(ids[at])
            at += 1
    return out


class TemplateEngine:
    """vLLM's token endpoints over `tokenizer` and the chat template `template`."""

    def __init__(
        self,
        tokenizer: Any,
        template: str,
        end_of_turn: str,
        model: str = "zoo",
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.end_of_turn = tokenizer.convert_tokens_to_ids(end_of_turn)
        """The id the model ends its turn on (generate's stop token)."""
        self.model = model
        self.template_kwargs = dict(template_kwargs or {})
        """Template variables of every rendering (`bos_token`, `eos_token` of the model's family)."""
        self.answers: deque[dict[str, Any]] = deque()
        """What the model answers next, one message per generate."""
        self.pieces: dict[str, tuple[str, ...]] = {}
        """Text the model samples in other pieces than the tokenizer encodes it (`{"Sunny": ("Sun", "ny")}`):
        in a sampled answer, the ids of each key are those of its pieces, each encoded alone, so the
        template's rendering of the answer's text is other ids than the model's."""
        self.detokenizes = True
        """Whether `/detokenize` is served (False: it answers 404, as a gateway serving only the chat routes)."""
        self._context: list[dict[str, Any]] = []
        self._tools: Any = None
        self._sampled: dict[tuple[int, ...], dict[str, Any]] = {}
        self._call_ids = (f"call{n:05d}" for n in itertools.count())
        """Nine characters, alphanumeric: what Mistral's templates accept."""
        self._app = Starlette(routes=[Route("/{path:path}", self._endpoint, methods=["GET", "POST"])])

    def render_ids(self, request: Mapping[str, Any]) -> list[int]:
        """The template's rendering of a chat request (its `messages`, `tools` and template fields)."""
        kwargs = {**self.template_kwargs, **(request.get("chat_template_kwargs") or {})}
        return list(
            self.tokenizer.apply_chat_template(
                template_messages(request["messages"]),
                tools=request.get("tools"),
                chat_template=self.template,
                add_generation_prompt=request.get("add_generation_prompt", True),
                continue_final_message=request.get("continue_final_message", False),
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        )

    def sampled_ids(self, answer: Mapping[str, Any]) -> list[int]:
        """The ids the model samples for `answer` after the last prompt rendered with a generation
        prompt: the template's rendering of that request with the answer appended, from there up to
        the end-of-turn token."""
        request = {"messages": self._context, "tools": self._tools}
        prompt = self.render_ids(request)
        whole = self.render_ids({**request, "messages": [*self._context, answer], "add_generation_prompt": False})
        shared = 0
        while shared < min(len(prompt), len(whole)) and prompt[shared] == whole[shared]:
            shared += 1
        ids = whole[shared:]
        if self.end_of_turn in ids:
            ids = ids[: ids.index(self.end_of_turn) + 1]
        for text, pieces in self.pieces.items():
            ids = _replaced(ids, self._encode(text), [i for piece in pieces for i in self._encode(piece)])
        return ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("add_generation_prompt", True):
            self._context, self._tools = list(request["messages"]), request.get("tools")
        sampling = {"temperature": request.get("temperature", 1.0), "max_tokens": request.get("max_tokens", 64)}
        return {
            "request_id": "zoo",
            "token_ids": self.render_ids(request),
            "sampling_params": sampling,
            "model": self.model,
        }

    def _generate(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.answers.popleft()
        if answer.get("tool_calls"):
            calls = [{"id": next(self._call_ids), "type": "function", **call} for call in answer["tool_calls"]]
            answer = {**answer, "tool_calls": calls}
        ids = self.sampled_ids(answer)
        self._sampled[tuple(ids)] = answer
        finish = "stop" if ids and ids[-1] == self.end_of_turn else "length"
        choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "logprobs": None}
        return {"request_id": request.get("request_id"), "model": self.model, "choices": [choice]}

    def _derender(self, request: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for choice in request["generate_response"]["choices"]:
            ids = tuple(choice["token_ids"])
            answer = self._sampled.get(ids) or self._sampled[(*ids, self.end_of_turn)]
            message: dict[str, Any] = {"role": "assistant", "content": answer.get("content")}
            if answer.get("reasoning"):
                message["reasoning"] = answer["reasoning"]
            if answer.get("tool_calls"):
                message["tool_calls"] = [{**call, "function": dict(call["function"])} for call in answer["tool_calls"]]
            choices.append({"index": choice["index"], "message": message, "finish_reason": choice["finish_reason"]})
        completion = sum(len(c["token_ids"]) for c in request["generate_response"]["choices"])
        prompt = request.get("prompt_tokens") or 0
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {
            "id": "chatcmpl-zoo",
            "object": "chat.completion",
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }

    def _answer(self, method: str, path: str, body: dict[str, Any]) -> Any:
        if method == "GET" and path == "/openapi.json":
            return {"paths": {p: {} for p in PATHS}}
        if method == "GET" and path == "/v1/models":
            return {"object": "list", "data": [{"id": self.model, "max_model_len": MAX_MODEL_LEN}]}
        if path == "/v1/chat/completions/render":
            return self._render(body)
        if path == "/inference/v1/generate":
            return self._generate(body)
        if path == "/v1/chat/completions/derender":
            return self._derender(body)
        if path == "/detokenize" and self.detokenizes:
            return {"prompt": self.tokenizer.decode(body["tokens"])}
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The engine as an ASGI app; a request it cannot render gets vLLM's 4xx error shape."""
        await self._app(scope, receive, send)

    async def _endpoint(self, request: Request) -> JSONResponse:
        body = await request.json() if request.method == "POST" else {}
        try:
            answer = self._answer(request.method, request.url.path, body)
        except Exception as exc:  # a template's raise_exception, a request it cannot render
            return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}, 400)
        if answer is None:
            return JSONResponse({"error": {"message": "not found", "type": "NotFoundError", "code": 404}}, 404)
        return JSONResponse(answer)
