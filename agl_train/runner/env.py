"""The environment of one rollout's agent process: `env_map` fields plus agl's own variables.

`env_map` maps variable names to dotted paths into the rollout, rooted at `input`:
`{"QUESTION": "input.question"}` sets `QUESTION` to `rollout.input["question"]`. Strings go
in as they are; other values as JSON (`3`, `true`, `{"a": 1}`). A path that does not resolve
is an error of that rollout only (`MissingInputField`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RESULT_PREFIX = "AGL_RESULT "
"""The agent launcher's last stdout line: `AGL_RESULT {"reward": 1.0}` (see `launch`)."""

# The OpenAI SDK refuses an empty api key; the proxy ignores it when it has no key itself.
PLACEHOLDER_API_KEY = "agl"


class MissingInputField(ValueError):
    """An `env_map` path that the rollout's input does not have."""


@dataclass(frozen=True)
class RolloutEndpoints:
    """Where a rollout's agent talks to: the per-rollout proxy URL, the model, the key, the store."""

    base_url: str
    model: str
    key: str = ""
    store_url: str | None = None


def resolve_path(input: Any, path: str) -> Any:
    """The value at dotted `path` (`input.question`, `input.meta.level`, `input.choices.0`)."""
    parts = path.split(".")
    if parts[0] != "input":
        raise MissingInputField(f"env_map path {path!r} must start with 'input.'")
    value = input
    walked = "input"
    for part in parts[1:]:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise MissingInputField(f"the rollout input has no field {path!r} ({walked} has no {part!r})")
        walked += "." + part
    return value


def env_value(value: Any) -> str:
    """How a value becomes an environment variable: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def mapped_env(input: Any, env_map: Mapping[str, str]) -> dict[str, str]:
    """The `env_map` variables of one rollout; MissingInputField names the first missing path."""
    return {name: env_value(resolve_path(input, path)) for name, path in env_map.items()}


def agl_env(rollout_id: str, attempt_id: str, input: Any, endpoints: RolloutEndpoints) -> dict[str, str]:
    """agl's variables: ids, the per-rollout base URL (also as `OPENAI_BASE_URL`, so an
    unmodified OpenAI-SDK agent is traced), the key, the model, the store and the whole input."""
    env = {
        "AGL_ROLLOUT_ID": rollout_id,
        "AGL_ATTEMPT_ID": attempt_id,
        "AGL_BASE_URL": endpoints.base_url,
        "AGL_MODEL": endpoints.model,
        "AGL_KEY": endpoints.key,
        "AGL_INPUT": json.dumps(input, ensure_ascii=False),
        "OPENAI_BASE_URL": endpoints.base_url,
        "OPENAI_API_KEY": endpoints.key or PLACEHOLDER_API_KEY,
    }
    if endpoints.store_url:
        env["AGL_STORE_URL"] = endpoints.store_url
    return env


def rollout_env(
    rollout_id: str, attempt_id: str, input: Any, env_map: Mapping[str, str], endpoints: RolloutEndpoints
) -> dict[str, str]:
    """`env_map` variables plus agl's (agl's win on a name clash: the ids must be right)."""
    return {**mapped_env(input, env_map), **agl_env(rollout_id, attempt_id, input, endpoints)}


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The payload of the last `AGL_RESULT` line of an agent's stdout, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                payload = json.loads(line[len(RESULT_PREFIX) :])
            except json.JSONDecodeError:
                return None
            return payload if isinstance(payload, dict) else None
    return None
