"""The token chain on real chat templates (a zoo): a bridged prompt is, id for id, the template's
rendering of the whole conversation; where the template does not only append (Mistral v0.3 moves
the tools and the system prompt to the last user message, Qwen3 drops earlier reasoning at a new
user turn) the call branches with the cause, its prompt the template's rendering rebuilt from the
model's own ids; never a duplicated head.

Each template renders with the real-vocabulary tokenizer (Qwen2.5's; the other families' special
tokens added, as their own tokenizers have them) in an in-process engine serving vLLM's token
endpoints (`tests/support/template_engine.py`), behind a real `LLMProxy` and `SQLiteStore`. The model
samples what the template writes for its answer, so every id of a bridged prompt can be checked; where
it samples some text as other ids (`TemplateEngine.pieces`), a rebuilt prompt keeps them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl_proxy.common.deployments import parse_deployment
from examples.tiny_vllm.real_vocab import QWEN2_5, QWEN3
from tests.support.conversations import TOOL_RESULT, tools
from tests.support.template_engine import TemplateEngine

from .helpers import model_entry, serve, wait_for_spans

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
SYSTEM = {"role": "system", "content": "You are a weather agent."}
OTHER_SYSTEM = {"role": "system", "content": "You are a terse weather agent."}
PARIS = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
LYON = {"name": "get_weather", "arguments": '{"city": "Lyon"}'}


@dataclass(frozen=True)
class Family:
    template: Path
    end_of_turn: str
    added: tuple[str, ...] = ()
    """Its tokenizer's special tokens that Qwen2.5's vocabulary lacks."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    parallel_calls: bool = True


DEEPSEEK_TOKENS = tuple(
    f"<｜{name}｜>"
    for name in (
        "begin▁of▁sentence", "end▁of▁sentence", "User", "Assistant", "tool▁calls▁begin", "tool▁calls▁end",
        "tool▁call▁begin", "tool▁call▁end", "tool▁sep", "tool▁outputs▁begin", "tool▁outputs▁end",
        "tool▁output▁begin", "tool▁output▁end",
    )
)  # fmt: skip
FAMILIES = {
    "qwen2.5": Family(QWEN2_5.template, "<|im_end|>"),
    "qwen3": Family(QWEN3.template, "<|im_end|>", ("<think>", "</think>", "<tool_response>", "</tool_response>")),
    "mistral-v0.3": Family(
        TEMPLATES / "mistral_v0.3.jinja",
        "</s>",
        ("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]")
        + ("[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        {"bos_token": "<s>", "eos_token": "</s>"},
    ),
    "llama-3.1": Family(
        TEMPLATES / "llama3.1_json.jinja",
        "<|eot_id|>",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "date_string": "26 Jul 2024"},
        parallel_calls=False,  # "This model only supports single tool-calls at once!"
    ),
    "deepseek-v3": Family(
        TEMPLATES / "deepseekv3.jinja",
        "<｜end▁of▁sentence｜>",
        DEEPSEEK_TOKENS,
        {"bos_token": DEEPSEEK_TOKENS[0], "eos_token": DEEPSEEK_TOKENS[1]},
    ),
}


@pytest.fixture(scope="module")
def zoo_tokenizer(real_tokenizer: Any) -> Any:
    """The real vocabulary with every family's special tokens added (Qwen2.5 renders with `real_tokenizer`)."""
    tokenizer = copy.deepcopy(real_tokenizer)
    added = sorted({token for family in FAMILIES.values() for token in family.added})
    tokenizer.add_special_tokens({"additional_special_tokens": added}, replace_extra_special_tokens=False)
    return tokenizer


def _engine(name: str, real_tokenizer: Any, zoo_tokenizer: Any) -> TemplateEngine:
    family = FAMILIES[name]
    tokenizer = real_tokenizer if not family.added else zoo_tokenizer
    return TemplateEngine(
        tokenizer, family.template.read_text(), family.end_of_turn, template_kwargs=family.template_kwargs
    )


def _calls(*functions: dict[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": f} for f in functions],
    }


def _text(content: str, reasoning: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **({"reasoning": reasoning} if reasoning else {})}


def _results(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": TOOL_RESULT} for c in answer.get("tool_calls") or ()]


class Agent:
    """A chat agent on the proxy: it keeps its history, sends it with the tools, and appends each
    answer as it got it (reasoning sent back or not) and then what follows it."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, engine: TemplateEngine, echo_reasoning: bool) -> None:
        self.http, self.base_url, self.engine, self.echo_reasoning = http, base_url, engine, echo_reasoning
        self.history: list[dict[str, Any]] = [SYSTEM]
        self.requests: list[dict[str, Any]] = []

    async def call(self, model_answer: dict[str, Any]) -> dict[str, Any]:
        self.engine.answers.append(model_answer)
        request = {"model": "zoo", "messages": list(self.history), "tools": tools(), "max_tokens": 64}
        self.requests.append(request)
        response = await self.http.post(f"{self.base_url}/chat/completions", json=request)
        assert response.status_code == 200, response.text
        message = {k: v for k, v in response.json()["choices"][0]["message"].items() if v is not None}
        for at, call in enumerate(message.get("tool_calls") or ()):
            # Mistral's templates take ids of nine letters and digits only; ids aside, the echo is the answer.
            if not (len(call["id"]) == 9 and call["id"].isalnum()):
                call["id"] = f"a{len(self.requests):04d}{at:04d}"
        if not self.echo_reasoning:
            message.pop("reasoning", None)
            message.pop("reasoning_content", None)
        self.history.append(message)
        return message


async def _tool_agent(agent: Agent, parallel: bool, reasoning: bool) -> None:
    """Two user turns, each: a tool call (two at once where the family can), the results, an answer."""
    think = "The user wants the weather." if reasoning else None
    agent.history.append({"role": "user", "content": "How is the weather in Paris?"})
    for turn in range(2):
        first = _calls(PARIS, LYON) if parallel else _calls(PARIS)
        called = await agent.call({**first, **({"reasoning": think} if think else {})})
        agent.history += _results(called)
        await agent.call(_text(f"Sunny, {20 + turn} degrees.", think))
        agent.history.append({"role": "user", "content": "And tomorrow?"})


async def _chains(store: Any, rollout_id: str, count: int) -> list[tuple[dict[str, Any], list[int]]]:
    spans = sorted(await wait_for_spans(store, rollout_id, count), key=lambda s: s.sequence_id)
    return [(s.attributes["agl.chain"], s.attributes["agl.prompt_token_ids"]) for s in spans]


async def _changed_system(agent: Agent) -> None:
    """A user turn, then another under a new system prompt."""
    agent.history.append({"role": "user", "content": "How is the weather in Paris?"})
    await agent.call(_text("Sunny."))
    agent.history[0] = OTHER_SYSTEM
    agent.history.append({"role": "user", "content": "And tomorrow?"})
    await agent.call(_text("Rainy."))


async def _run(engine, proxy_factory, store, new_rollout, http, script, echo_reasoning=True, **info):
    """`script` run by an agent through a proxy in front of `engine`: the agent, and its calls' chains and prompts."""
    async with serve(engine) as url:
        proxy = await proxy_factory([model_entry("zoo", url + "/v1", backend_model="zoo", **info)])
        rollout_id, attempt_id = await new_rollout()
        agent = Agent(http, proxy.as_resource().get_base_url(rollout_id, attempt_id), engine, echo_reasoning)
        await script(agent)
        chains = await _chains(store, rollout_id, len(agent.requests))
    return agent, chains


def _shape(chains: list[tuple[dict[str, Any], list[int]]]) -> list[str]:
    return [chain["prompt"] if chain["cause"] is None else f"{chain['prompt']}:{chain['cause']}" for chain, _ in chains]


# What the chain makes of a tool agent's four calls (call, call after the tool results, new user turn, again).
APPENDS = ["rendered:first_call", "bridged", "bridged", "bridged"]
REWRITES = ["rendered:first_call", *["branched:template_rewrites_history"] * 3]
EXPECTED = {
    "qwen2.5": APPENDS,
    "llama-3.1": APPENDS,
    # The system prompt only in the last message when that is a user's, the tools before the last user message.
    "mistral-v0.3": REWRITES,
    # vLLM's example template ends every rendering with a newline that a following turn replaces.
    "deepseek-v3": REWRITES,
    # An answer without reasoning: its empty think block, there as the last answer, gone once another message follows.
    "qwen3": REWRITES,
}


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_bridged_prompts_are_the_template_s_own_and_other_calls_branch_with_the_cause(
    name, real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine(name, real_tokenizer, zoo_tokenizer)
    script = partial(_tool_agent, parallel=FAMILIES[name].parallel_calls, reasoning=False)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, script)
    assert _shape(chains) == EXPECTED[name]
    for request, (_, prompt) in zip(agent.requests, chains, strict=True):
        assert prompt == engine.render_ids(request)


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_a_changed_system_prompt_is_rendered_whole(
    name, real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine(name, real_tokenizer, zoo_tokenizer)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, _changed_system)
    assert _shape(chains) == ["rendered:first_call", "branched:system_changed"]
    for request, (_, prompt) in zip(agent.requests, chains, strict=True):
        assert prompt == engine.render_ids(request)


# Qwen3 with reasoning: kept until the next user turn, where the template drops every earlier think block.
REASONING = {
    "sent back": ["rendered:first_call", "bridged", "branched:template_drops_reasoning", "bridged"],
    # The template renders each answer without the reasoning the client left out.
    "left out": ["rendered:first_call", *["branched:reasoning_dropped"] * 3],
}


@pytest.mark.parametrize("echo", list(REASONING))
async def test_reasoning_follows_the_template_by_default(
    echo, real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine("qwen3", real_tokenizer, zoo_tokenizer)
    script = partial(_tool_agent, parallel=True, reasoning=True)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, script, echo == "sent back")
    assert _shape(chains) == REASONING[echo]
    for request, (_, prompt) in zip(agent.requests, chains, strict=True):
        assert prompt == engine.render_ids(request)


# The model samples "Sunny" and "Paris" as other ids than the tokenizer encodes them ("S" + "unny", "Paris"):
# rendered again, the earlier answers' content and tool calls would not be the ids the model sampled.
SAMPLED_APART = {"Sunny": ("Sun", "ny"), "Paris": ("Par", "is")}


@pytest.mark.parametrize("echo", list(REASONING))
async def test_a_history_the_template_rewrites_keeps_the_model_s_own_ids(
    echo, real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine("qwen3", real_tokenizer, zoo_tokenizer)
    engine.pieces = SAMPLED_APART
    script = partial(_tool_agent, parallel=True, reasoning=True)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, script, echo == "sent back")
    # Where the template drops the reasoning, the call branches and its prompt is rebuilt: the cause says why.
    assert _shape(chains) == REASONING[echo]
    sunny, paris = (
        [i for piece in SAMPLED_APART[word] for i in engine.tokenizer.encode(piece)] for word in ("Sunny", "Paris")
    )
    for request, (_, prompt) in zip(agent.requests, chains, strict=True):
        whole = engine.render_ids(request)
        # The template's text, without the reasoning it drops ...
        assert engine.tokenizer.decode(prompt) == engine.tokenizer.decode(whole)
        # ... and every earlier answer's content and tool calls as the model sampled them, never re-tokenized.
        history = [m for m in request["messages"] if m["role"] == "assistant"]
        texts = sum(1 for m in history if m.get("content"))
        calls = sum(1 for m in history for c in m.get("tool_calls") or () if "Paris" in c["function"]["arguments"])
        assert (_count(prompt, sunny), _count(prompt, paris)) == (texts, calls)
        assert _count(whole, sunny) == _count(whole, paris) == 0


async def test_a_rebuilt_prompt_that_cannot_be_shown_is_rendered_whole(
    real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine("qwen3", real_tokenizer, zoo_tokenizer)
    engine.pieces = SAMPLED_APART
    engine.detokenizes = False  # the texts of the model's ids cannot be compared with the template's
    script = partial(_tool_agent, parallel=True, reasoning=True)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, script)
    assert _shape(chains) == ["rendered:first_call", "bridged", "branched:rebuild_unproven", "bridged"]
    (_, rendered), request = chains[2], agent.requests[2]
    assert rendered == engine.render_ids(request)


def _count(ids: list[int], run: list[int]) -> int:
    return sum(ids[at : at + len(run)] == run for at in range(len(ids)))


async def test_a_deployment_may_keep_all_reasoning(
    real_tokenizer, zoo_tokenizer, proxy_factory, store, new_rollout, http
) -> None:
    engine = _engine("qwen3", real_tokenizer, zoo_tokenizer)
    script = partial(_tool_agent, parallel=True, reasoning=True)
    agent, chains = await _run(engine, proxy_factory, store, new_rollout, http, script, agl_reasoning="keep")
    # One training row: the reasoning the template drops at the new user turn is kept, and the span says so.
    assert _shape(chains) == ["rendered:first_call", "bridged", "bridged:reasoning_kept", "bridged"]
    for (_, parent), (_, prompt), request in zip(chains, chains[1:], agent.requests[1:], strict=False):
        assert prompt[: len(parent)] == parent
        whole = engine.render_ids(request)
        new = prompt[len(parent) :]
        # After the parent's answer (its sampled ids) only the new messages: no second head.
        assert SYSTEM["content"] not in real_tokenizer.decode(new)
        assert whole[-8:] == new[-8:]


def test_the_reasoning_option_is_template_or_keep() -> None:
    assert not parse_deployment(model_entry("zoo", "http://e/v1")).keep_reasoning
    assert parse_deployment(model_entry("zoo", "http://e/v1", agl_reasoning="keep")).keep_reasoning
    with pytest.raises(ValueError, match="agl_reasoning must be 'template' or 'keep'"):
        parse_deployment(model_entry("zoo", "http://e/v1", agl_reasoning="drop"))
