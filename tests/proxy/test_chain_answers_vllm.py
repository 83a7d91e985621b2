"""The token chain's answers are vLLM's own chat answers: on turns that end on the end-of-turn token, on
`max_tokens`, on a stop string or a listed stop token, with the tool-call ids vLLM's chat endpoint makes.

vLLM's detokenizer leaves a stop token's text out of an answer, while the derender endpoint decodes
every id it is given (its parser path keeping special tokens): the chain must hand it the ids
whose text the chat endpoint shows. A vLLM on the real-vocabulary model (Qwen2.5's ids and
template, the hermes tool parser) runs `examples.tiny_vllm.end_turn.EndTurnAfter`, so every turn
is a few tokens, then `<|im_end|>`, as a trained model's. Sampled greedily, the chain and vLLM's
own chat endpoint generate the same ids, and their answers (content, reasoning, tool calls,
finish_reason, stop_reason, usage) must be the same: with and without tools, streamed or not, on
a bridged follow-up, and through the Messages API. The span keeps every sampled id, the stop id
too. Where greedy sampling gives one token over and over, a seeded sample (the same ids on both
endpoints) gives text to cut at stop strings.
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
import openai
import pytest

from agl_proxy.server.proxy import LLMProxy
from examples.tiny_vllm.end_turn import end_turn_after
from examples.tiny_vllm.vllm_server import VLLMServer
from tests.support.conversations import anthropic_tool_messages, anthropic_tools, messages, tools

from .helpers import model_entry, wait_for_spans
from .test_chain_stream_vllm import _assembled
from .test_token_chain_vllm import _client

pytestmark = pytest.mark.vllm
TURN_TOKENS = 6
END_TURN = end_turn_after(TURN_TOKENS)
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 32, "extra_body": {"return_token_ids": True, **END_TURN}}


@pytest.fixture(scope="module")
def end_of_turn(real_tokenizer: Any) -> int:
    """`<|im_end|>`'s id in the real vocabulary: the token every turn ends on."""
    token_id: int = real_tokenizer.convert_tokens_to_ids("<|im_end|>")
    return token_id


@pytest.fixture(scope="module")
def ending_vllm(real_vllm_server: VLLMServer) -> VLLMServer:
    """The suite's real-vocabulary vLLM (the hermes tool parser); the requests here ask it, with END_TURN, to end
    their turns after TURN_TOKENS tokens."""
    return real_vllm_server


def ending_entry(server: VLLMServer) -> list[dict[str, Any]]:
    """A deployment of `server` whose calls ask for turns that end (END_TURN as a request default)."""
    entry = model_entry(server.model, server.base_url, backend_model=server.model)
    entry["litellm_params"].update(END_TURN)
    return [entry]


@pytest.fixture
async def chain(proxy_factory: Any, ending_vllm: VLLMServer) -> LLMProxy:
    proxy: LLMProxy = await proxy_factory(ending_entry(ending_vllm))
    return proxy


@pytest.fixture
async def vllm_s_own(ending_vllm: VLLMServer) -> Any:
    """An OpenAI client of vLLM's own chat endpoint."""
    async with openai.AsyncOpenAI(base_url=ending_vllm.base_url, api_key="-", max_retries=0) as client:
        yield client


def _answer(completion: Any) -> dict[str, Any]:
    """What an agent reads of a chat completion's one choice."""
    [choice] = completion.choices
    message = choice.message
    return {
        "content": message.content,
        "reasoning": (message.model_extra or {}).get("reasoning"),
        "tool_calls": [(c.function.name, c.function.arguments) for c in message.tool_calls or ()],
        "finish_reason": choice.finish_reason,
        "stop_reason": (choice.model_extra or {}).get("stop_reason"),
        "token_ids": (choice.model_extra or {}).get("token_ids"),
        "completion_tokens": completion.usage.completion_tokens,
    }


async def _streamed(client: openai.AsyncOpenAI, **request: Any) -> dict[str, Any]:
    """A streamed answer as the client assembles it, with the stop_reason its finishing chunk gives."""
    stream = await client.chat.completions.create(stream=True, **request)
    chunks = [chunk async for chunk in stream]
    [end] = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    return {**_assembled(chunks), "stop_reason": (end.choices[0].model_extra or {}).get("stop_reason")}


async def _ask(client: openai.AsyncOpenAI, stream: bool, **request: Any) -> dict[str, Any]:
    if stream:
        streamed = await _streamed(client, **request)
        return {**streamed, "tool_calls": [call[:2] for call in streamed["tool_calls"]]}
    return _answer(await client.chat.completions.create(**request))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("offered", [True, False], ids=["tools", "no-tools"])
async def test_an_answer_that_ends_on_its_stop_token_is_vllm_s_chat_answer(
    chain, vllm_s_own, ending_vllm, end_of_turn, new_rollout, store, stream, offered
) -> None:
    ids = await new_rollout()
    request = {"model": ending_vllm.model, "messages": messages(), **GREEDY}
    if offered:
        request["tools"] = tools()
    async with _client(chain, ids) as client:
        mine = await _ask(client, stream, **request)
    theirs = await _ask(vllm_s_own, stream, **request)

    assert theirs["token_ids"] == mine["token_ids"]
    assert len(theirs["token_ids"]) == TURN_TOKENS + 1 and theirs["token_ids"][-1] == end_of_turn
    assert mine == theirs
    [span] = await wait_for_spans(store, ids[0], 1)
    assert span.attributes["agl.choices"][0]["token_ids"] == theirs["token_ids"]  # the stop id kept for training


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_a_bridged_follow_up_is_vllm_s_chat_answer(
    chain, vllm_s_own, ending_vllm, end_of_turn, new_rollout, store, stream
) -> None:
    """The agent sends back the answer as it got it, then a new user turn: the follow-up is bridged
    (vLLM re-renders that history to other ids, but its greedy turn is the same ids)."""
    ids = await new_rollout()
    request = {"model": ending_vllm.model, "tools": tools(), **GREEDY}
    async with _client(chain, ids) as client:
        first = await client.chat.completions.create(messages=messages(), **request)
        echoed = first.choices[0].message.model_dump(exclude_none=True)
        history = [*messages(), echoed, {"role": "user", "content": "And in Paris?"}]
        mine = await _ask(client, stream, messages=history, **request)
    theirs = await _ask(vllm_s_own, stream, messages=history, **request)

    assert theirs["token_ids"] == mine["token_ids"] and theirs["token_ids"][-1] == end_of_turn
    assert mine == theirs
    spans = await wait_for_spans(store, ids[0], 2)
    assert spans[1].attributes["agl.chain"]["prompt"] == "bridged"
    assert spans[1].attributes["agl.choices"][0]["token_ids"] == theirs["token_ids"]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_a_messages_answer_is_the_one_vllm_s_chat_endpoint_gives(
    chain, proxy_factory, ending_vllm, end_of_turn, new_rollout, store, stream
) -> None:
    """Through `/v1/messages`, the chain against the pass-through (vLLM's chat endpoint), the first call and a
    follow-up that sends the answer's content blocks back."""
    passthrough = await proxy_factory(ending_entry(ending_vllm), token_chain="off")
    ids = await new_rollout()
    answers: list[list[Any]] = []
    for proxy in (chain, passthrough):
        root = proxy.as_resource().get_base_url(*ids).removesuffix("/v1")
        async with anthropic.AsyncAnthropic(base_url=root, api_key="-", max_retries=0) as client:
            history = anthropic_tool_messages()
            answers.append([])
            for turn in range(2):
                request: dict[str, Any] = {
                    "model": ending_vllm.model,
                    "system": messages()[0]["content"],
                    "messages": history,
                    "tools": anthropic_tools(),
                    "max_tokens": 32,
                    "extra_body": {"temperature": 0},
                }
                if stream:
                    async with client.messages.stream(**request) as events:
                        answer = await events.get_final_message()
                else:
                    answer = await client.messages.create(**request)
                answers[-1].append(answer)
                blocks = [block.model_dump(exclude_none=True) for block in answer.content]
                history = [*history, {"role": "assistant", "content": blocks}, {"role": "user", "content": f"#{turn}"}]

    spans = await wait_for_spans(store, ids[0], 4)
    assert spans[1].attributes["agl.chain"]["prompt"] == "bridged"  # the chain's follow-up
    for span in spans:
        assert span.attributes["agl.choices"][0]["token_ids"][-1] == end_of_turn
    mine, theirs = answers
    for a, b in zip(mine, theirs, strict=True):
        assert _read(a) == _read(b)
        assert a.stop_reason == "end_turn"


def _read(answer: Any) -> dict[str, Any]:
    """What an agent reads of a Messages answer (its blocks without their ids, why it ended, its length)."""
    return {
        "content": [block.model_dump(exclude={"id"}) for block in answer.content],
        "stop": (answer.stop_reason, answer.stop_sequence),
        "output_tokens": answer.usage.output_tokens,
    }


SEEDED: dict[str, Any] = {"temperature": 1.0, "seed": 1, "max_tokens": 12, "extra_body": {"return_token_ids": True}}
"""Sampled, the same ids on both endpoints: varied text, where greedy gives one token over and over."""


@pytest.fixture
async def free_chain(proxy_factory: Any, ending_vllm: VLLMServer) -> LLMProxy:
    """The chain in front of the same vLLM, its turns not ended (a stop token ends them as the request says)."""
    proxy: LLMProxy = await proxy_factory(
        [model_entry(ending_vllm.model, ending_vllm.base_url, backend_model=ending_vllm.model)]
    )
    return proxy


def _with(request: dict[str, Any], **extra_body: Any) -> dict[str, Any]:
    return {**request, "extra_body": {**request["extra_body"], **extra_body}}


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("offered", [True, False], ids=["tools", "no-tools"])
async def test_an_answer_cut_at_max_tokens_is_vllm_s_chat_answer(
    free_chain, vllm_s_own, ending_vllm, new_rollout, stream, offered
) -> None:
    request = {"model": ending_vllm.model, "messages": messages(), **SEEDED}
    if offered:
        request["tools"] = tools()
    ids = await new_rollout()
    async with _client(free_chain, ids) as client:
        mine = await _ask(client, stream, **request)
    theirs = await _ask(vllm_s_own, stream, **request)

    assert len(theirs["token_ids"]) == SEEDED["max_tokens"]
    assert theirs.get("finish_reason", theirs.get("finish")) == "length"
    assert mine == theirs


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("offered", [True, False], ids=["tools", "no-tools"])
@pytest.mark.parametrize("include", [False, True], ids=["cut", "included"])
async def test_an_answer_cut_at_a_stop_string_is_vllm_s_chat_answer(
    free_chain, vllm_s_own, ending_vllm, new_rollout, store, stream, offered, include
) -> None:
    """Two stop strings from the middle of the answer vLLM gives without them, each starting inside a token: the one
    that completes first ends the answer; its content is cut there (or after it, `include_stop_str_in_output`)."""
    ids = await new_rollout()
    request = {"model": ending_vllm.model, "messages": messages(), **SEEDED}
    if offered:
        request["tools"] = tools()
    text = (await vllm_s_own.chat.completions.create(**request)).choices[0].message.content
    stop = [text[len(text) // 2 : len(text) // 2 + 3], text[3:6]]
    request = _with({**request, "stop": stop}, include_stop_str_in_output=include)
    async with _client(free_chain, ids) as client:
        mine = await _ask(client, stream, **request)
    theirs = await _ask(vllm_s_own, stream, **request)

    assert theirs.get("finish_reason", theirs.get("finish")) == "stop" and theirs["stop_reason"] == stop[1]
    assert mine == theirs
    [span] = await wait_for_spans(store, ids[0], 1)
    # The span keeps what generate returned: every sampled id, the stop string's too.
    assert span.attributes["agl.choices"][0]["token_ids"] == theirs["token_ids"]
    assert span.attributes["agl.response"]["choices"][0]["stop_reason"] == stop[1]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_an_answer_that_ends_on_a_listed_stop_token_is_vllm_s_chat_answer(
    free_chain, vllm_s_own, ending_vllm, new_rollout, stream
) -> None:
    request = {"model": ending_vllm.model, "messages": messages(), **SEEDED}
    sampled = (await vllm_s_own.chat.completions.create(**request)).choices[0].model_extra["token_ids"]
    request = _with(request, stop_token_ids=[sampled[4]])
    ids = await new_rollout()
    async with _client(free_chain, ids) as client:
        mine = await _ask(client, stream, **request)
    theirs = await _ask(vllm_s_own, stream, **request)

    assert theirs["token_ids"] == sampled[: sampled.index(sampled[4]) + 1]
    assert theirs["stop_reason"] == sampled[4]
    assert mine == theirs


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_an_answer_that_ends_on_its_stop_token_despite_stop_strings_is_vllm_s_chat_answer(
    chain, vllm_s_own, ending_vllm, end_of_turn, new_rollout, stream
) -> None:
    """Stop strings the answer never reaches: it ends on `<|im_end|>`, whose text the answer leaves out."""
    request = {"model": ending_vllm.model, "messages": messages(), "tools": tools(), "stop": ["never said"], **GREEDY}
    ids = await new_rollout()
    async with _client(chain, ids) as client:
        mine = await _ask(client, stream, **request)
    theirs = await _ask(vllm_s_own, stream, **request)

    assert theirs["token_ids"][-1] == end_of_turn and theirs["stop_reason"] is None
    assert mine == theirs


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_a_messages_answer_cut_at_a_stop_sequence_is_the_one_vllm_s_chat_endpoint_gives(
    free_chain, proxy_factory, vllm_s_own, ending_vllm, new_rollout, store, stream
) -> None:
    request = {"model": ending_vllm.model, "messages": messages(), **SEEDED}
    text = (await vllm_s_own.chat.completions.create(**request)).choices[0].message.content
    passthrough = await proxy_factory(
        [model_entry(ending_vllm.model, ending_vllm.base_url, backend_model=ending_vllm.model)], token_chain="off"
    )
    ids = await new_rollout()
    answers = []
    for proxy in (free_chain, passthrough):
        root = proxy.as_resource().get_base_url(*ids).removesuffix("/v1")
        async with anthropic.AsyncAnthropic(base_url=root, api_key="-", max_retries=0) as client:
            asked: dict[str, Any] = {
                "model": ending_vllm.model,
                "system": messages()[0]["content"],
                "messages": messages()[1:],
                "max_tokens": 12,
                "stop_sequences": [text[3:6]],
                "extra_body": {"temperature": 1.0, "seed": 1},
            }
            if stream:
                async with client.messages.stream(**asked) as events:
                    answers.append(await events.get_final_message())
            else:
                answers.append(await client.messages.create(**asked))

    mine, theirs = answers
    assert (theirs.stop_reason, theirs.stop_sequence) == ("stop_sequence", text[3:6])
    assert _read(mine) == _read(theirs)
    spans = await wait_for_spans(store, ids[0], 2)
    assert spans[0].attributes["agl.chain"]["prompt"] == "rendered"  # the chain's


VLLM_TOOL_CALL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
"""The ids vLLM's chat endpoint gives the hermes parser's calls (`make_tool_call_id`)."""


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_tool_calls_carry_ids_as_vllm_s_chat_endpoint_makes_them(
    free_chain, vllm_s_own, ending_vllm, real_tokenizer, new_rollout, store, stream
) -> None:
    """A named tool, the answer kept to the ids of one whole call (`allowed_token_ids`, within vLLM's structured
    output), so that the tiny model's call parses."""
    clock = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
    call_ids = real_tokenizer.encode('<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call><|im_end|>')
    request = {
        "model": ending_vllm.model,
        "messages": messages(),
        "tools": [clock],
        "tool_choice": {"type": "function", "function": {"name": "clock"}},
        "temperature": 0,
        "max_tokens": 64,
        "extra_body": {"allowed_token_ids": sorted(set(call_ids))},
    }
    ids = await new_rollout()
    async with _client(free_chain, ids) as client:
        if stream:
            chain_ids = [call[2] for call in (await _streamed(client, **request))["tool_calls"]]
        else:
            chain_ids = [
                call.id for call in (await client.chat.completions.create(**request)).choices[0].message.tool_calls
            ]
    theirs = await vllm_s_own.chat.completions.create(**request)

    own_ids = [call.id for call in theirs.choices[0].message.tool_calls or ()]
    assert len(own_ids) == len(chain_ids) == 1
    assert all(VLLM_TOOL_CALL_ID.fullmatch(i) for i in own_ids + chain_ids)
    [span] = await wait_for_spans(store, ids[0], 1)
    assert [c["id"] for c in span.attributes["agl.response"]["choices"][0]["message"]["tool_calls"]] == chain_ids
