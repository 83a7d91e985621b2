"""The token chain's answers are vLLM's own chat answers, on turns that end on the end-of-turn token.

vLLM's detokenizer leaves a stop token's text out of an answer, while the derender endpoint decodes
every id it is given (its parser path keeping special tokens): the chain must hand it the ids
whose text the chat endpoint shows. A vLLM on the real-vocabulary model (Qwen2.5's ids and
template, the hermes tool parser) runs `examples.tiny_vllm.end_turn.EndTurnAfter`, so every turn
is a few tokens, then `<|im_end|>`, as a trained model's. Sampled greedily, the chain and vLLM's
own chat endpoint generate the same ids, and their answers (content, reasoning, tool calls,
finish_reason, stop_reason, usage) must be the same: with and without tools, streamed or not, on
a bridged follow-up, and through the Messages API. The span keeps every sampled id, the stop id
too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from agl_proxy.server.proxy import LLMProxy
from examples.tiny_vllm.end_turn import AFTER_ENV, TOKEN_ENV
from examples.tiny_vllm.vllm_server import VLLMServer, running_vllm_server
from tests.support.conversations import anthropic_tool_messages, anthropic_tools, messages, tools

from .helpers import model_entry, wait_for_spans
from .test_chain_stream_vllm import _assembled
from .test_token_chain_vllm import _client

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
TURN_TOKENS = 6
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 32, "extra_body": {"return_token_ids": True}}


@pytest.fixture(scope="module")
def end_of_turn(real_tokenizer: Any) -> int:
    """`<|im_end|>`'s id in the real vocabulary: the token every turn ends on."""
    token_id: int = real_tokenizer.convert_tokens_to_ids("<|im_end|>")
    return token_id


@pytest.fixture(scope="module")
def ending_vllm(
    real_vocab_model_path: Path, end_of_turn: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """The real-vocabulary model with the hermes tool parser, its turns ended after TURN_TOKENS tokens."""
    from examples.tiny_vllm.real_vocab import QWEN2_5

    args = (
        "--enable-scale-out", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--logits-processors", "examples.tiny_vllm.end_turn:EndTurnAfter",
    )  # fmt: skip
    env = {
        AFTER_ENV: str(TURN_TOKENS),
        TOKEN_ENV: str(end_of_turn),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    log_path = tmp_path_factory.mktemp("ending-hermes-vllm") / "vllm.log"
    with running_vllm_server(
        real_vocab_model_path,
        log_path=log_path,
        served_model_name=QWEN2_5.served_model_name,
        extra_args=args,
        extra_env=env,
    ) as server:
        yield server


@pytest.fixture
async def chain(proxy_factory: Any, ending_vllm: VLLMServer) -> LLMProxy:
    proxy: LLMProxy = await proxy_factory(
        [model_entry(ending_vllm.model, ending_vllm.base_url, backend_model=ending_vllm.model)]
    )
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
    entry = [model_entry(ending_vllm.model, ending_vllm.base_url, backend_model=ending_vllm.model)]
    passthrough = await proxy_factory(entry, token_chain="off")
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
        assert [block.model_dump(exclude={"id"}) for block in a.content] == [
            block.model_dump(exclude={"id"}) for block in b.content
        ]
        assert (a.stop_reason, a.stop_sequence, a.usage.output_tokens) == (
            b.stop_reason,
            b.stop_sequence,
            b.usage.output_tokens,
        )
        assert a.stop_reason == "end_turn"
