"""The prefix-break diagnosis on Qwen2.5's real vocabulary: a changed stop token and a response that is not UTF-8."""

from __future__ import annotations

from agl_train.core.prefix_break import classify_break

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
FOLLOW_UP = {"role": "user", "content": "And tomorrow?"}


def prompt_ids(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def test_a_stop_token_the_template_closes_with_another_one_is_stop_token_not_template(real_tokenizer) -> None:
    # The model stopped with <|endoftext|> (a stop token of Qwen2.5's generation config); the next prompt
    # renders the turn closed with <|im_end|>. The template kept everything else.
    previous = prompt_ids(real_tokenizer, [QUESTION])
    response = real_tokenizer.encode("Sunny.") + [real_tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    prompt = prompt_ids(real_tokenizer, [QUESTION, {"role": "assistant", "content": "Sunny."}, FOLLOW_UP])

    assert classify_break(previous, response, prompt, real_tokenizer) == "stop_token"


def test_a_response_that_is_not_utf8_is_retokenized_not_other(real_tokenizer) -> None:
    # The last sampled token is the first byte of a three-byte character: the text the agent got back
    # ends before it (vLLM holds an unfinished character back), so the next prompt cannot hold that id.
    previous = prompt_ids(real_tokenizer, [QUESTION])
    half_character = real_tokenizer.convert_tokens_to_ids("ä")  # byte 0xE4 alone
    response = real_tokenizer.encode("Sunny") + [half_character]
    prompt = prompt_ids(real_tokenizer, [QUESTION, {"role": "assistant", "content": "Sunny"}, FOLLOW_UP])

    assert "\ufffd" in real_tokenizer.decode(response)
    assert classify_break(previous, response, prompt, real_tokenizer) == "retokenized"
