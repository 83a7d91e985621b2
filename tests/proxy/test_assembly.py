"""Stream assembly: SSE bytes in any split, out comes the non-stream response."""

from __future__ import annotations

import orjson

from agl_proxy.recording.assembly import StreamAssembler


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


TOOL_STREAM = sse(
    {
        "id": "c1",
        "model": "m",
        "created": 1,
        "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}],
    },
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "token_ids": [2048]}]},
    {
        "id": "c1",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}}
                    ]
                },
                "token_ids": [7, 8],
            }
        ],
    },
    {
        "id": "c1",
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                "token_ids": [9],
            }
        ],
    },
    {
        "id": "c1",
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                "token_ids": [10, 2049],
            }
        ],
    },
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "token_ids": [2], "finish_reason": "tool_calls"}]},
)


def test_tool_call_stream_in_awkward_splits() -> None:
    for split in (1, 7, 64, len(TOOL_STREAM)):
        assembler = StreamAssembler("chat")
        for i in range(0, len(TOOL_STREAM), split):
            assembler.feed(TOOL_STREAM[i : i + split])
        response = assembler.result()
        [choice] = response["choices"]
        assert response["prompt_token_ids"] == [1, 2, 3] and response["object"] == "chat.completion"
        assert choice["token_ids"] == [2048, 7, 8, 9, 10, 2049, 2]  # empty deltas carry tokens too
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"] == [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]
        assert assembler.done


def test_completion_stream_with_logprobs() -> None:
    stream = sse(
        {
            "id": "x",
            "choices": [
                {
                    "index": 0,
                    "text": "a",
                    "prompt_token_ids": [5],
                    "token_ids": [1],
                    "logprobs": {
                        "tokens": ["a"],
                        "token_logprobs": [-0.1],
                        "text_offset": [0],
                        "top_logprobs": [{"a": -0.1}],
                    },
                }
            ],
        },
        {
            "id": "x",
            "choices": [
                {
                    "index": 0,
                    "text": "b",
                    "prompt_token_ids": None,
                    "token_ids": [2],
                    "logprobs": {
                        "tokens": ["b"],
                        "token_logprobs": [-0.2],
                        "text_offset": [1],
                        "top_logprobs": [{"b": -0.2}],
                    },
                    "finish_reason": "length",
                }
            ],
        },
    )
    assembler = StreamAssembler("text_completion")
    assembler.feed(stream)
    [choice] = assembler.result()["choices"]
    assert choice["text"] == "ab" and choice["prompt_token_ids"] == [5] and choice["token_ids"] == [1, 2]
    assert choice["logprobs"]["token_logprobs"] == [-0.1, -0.2]


def test_error_event_and_garbage_are_noticed() -> None:
    assembler = StreamAssembler("chat")
    assembler.feed(b'data: {"error": {"message": "boom"}}\n\ndata: <html>\n\n')
    assert assembler.error == {"message": "boom"} and assembler.garbage == b"<html>"
