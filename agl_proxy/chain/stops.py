"""Where vLLM's chat endpoint ends an answer's text, and the `stop_reason` it gives.

`/inference/v1/generate` stops where the chat endpoint stops (the engine checks stop strings
on the text it decodes) and returns every sampled id, but neither the cut text nor the reason;
the derender decodes every id it is given. vLLM's detokenizer (`vllm/v1/engine/detokenizer.py`,
`check_stop_strings`) cuts the text before the stop string that completes first (ties: the
request's order), or after it with `include_stop_str_in_output`, and the chat endpoint parses
that text; its `stop_reason` is that string, or the id of a stop token the request listed in
`stop_token_ids` (`vllm/v1/core/sched/utils.py`, `check_stop`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def stop_strings(sampling_params: Mapping[str, Any]) -> list[str]:
    """The request's stop strings, as vLLM's sampling params hold them."""
    stop = sampling_params.get("stop") or []
    return [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str) and s]


def stop_string_cut(text: str, stops: Sequence[str], include: bool) -> tuple[str, int] | None:
    """The stop string that ends `text` and the length vLLM cuts the text to; None when none is in it.

    vLLM looks only at the text each step adds, and stops at the first match: an answer holds a
    whole stop string only at its end, so the one that completes first in the whole text is it."""
    found: tuple[str, int] | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (found is None or at + len(stop) < found[1] + len(found[0])):
            found = (stop, at)
    if found is None:
        return None
    stop, at = found
    return stop, at + len(stop) if include else at


def cut_at_stop_string(message: dict[str, Any], sampling_params: Mapping[str, Any]) -> str | None:
    """Cut a derendered message's text where vLLM's chat endpoint cuts it: the stop string, or
    None when the text holds none (the answer ended on a stop token instead).

    The answer's text is its reasoning then its content, so the stop string is in the last of
    the two that has text."""
    field = "content" if message.get("content") else "reasoning"
    text = message.get(field)
    if not isinstance(text, str) or not text:
        return None
    include = bool(sampling_params.get("include_stop_str_in_output"))
    found = stop_string_cut(text, stop_strings(sampling_params), include)
    if found is None:
        return None
    stop, length = found
    message[field] = text[:length]
    return stop


def stop_token_reason(token_ids: Sequence[int], sampling_params: Mapping[str, Any]) -> int | None:
    """The `stop_reason` of an answer that ended on its last id: that id when the request listed it
    in `stop_token_ids` (vLLM says None for the end-of-sequence id)."""
    listed = sampling_params.get("stop_token_ids") or ()
    return token_ids[-1] if token_ids and token_ids[-1] in listed else None
