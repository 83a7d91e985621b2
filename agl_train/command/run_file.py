"""A run file read and checked before anything starts.

```yaml
agent: caps_agent:CapsAgent        # a class with run(), or module:function(task) returning the reward
tasks: tasks.jsonl                 # JSONL, Parquet, or a list of mappings
model: .cache/tiny-qwen2-real      # a local Hugging Face folder
env_map: {TEXT: input.text}        # environment variables of the agent, from task fields
agent_env: {CAPS_MAX_TOKENS: "16"} # more environment variables of the agent
steps: 4
config: {actor_rollout_ref.actor.optim.lr: 0.03}   # any agl or verl key, dotted or nested
```

Paths are relative to the file's folder; so is the agent, whose module is imported from that folder,
the current one or `PYTHONPATH`. Every error names the file and the field (`errors.RunFileError`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..runner.env import MissingInputField, mapped_env
from ..runner.function_agent import AGENT_CLASS as FUNCTION_AGENT_CLASS
from .errors import RunFileError
from .tasks import read_tasks

REQUIRED = ("agent", "tasks", "model")
OPTIONAL = ("val_tasks", "env_map", "agent_env", "steps", "out", "device", "check_rollout", "vllm_args", "config")
DEVICES = ("auto", "cpu", "gpu")
DEFAULT_STEPS = 4
DEFAULT_VAL_TASKS = 4
"""Without `val_tasks`, the first this many tasks validate."""
AGENT_PROBE = """
import inspect, sys
from agl_train.runner.launch import load_agent_class
try:
    agent = load_agent_class(sys.argv[1])
except Exception as exc:
    sys.exit(f"{type(exc).__name__}: {exc}")
print("class" if inspect.isclass(agent) else "function" if callable(agent) else type(agent).__name__)
"""


@dataclass(frozen=True)
class RunFile:
    """What a run file asks for, checked. `agent_class` is what the launcher runs (`FunctionAgent`
    for a function, whose spec is then `agent_function`)."""

    where: str
    agent: str
    agent_class: str
    agent_function: str | None
    tasks: list[dict[str, Any]]
    val_tasks: list[dict[str, Any]]
    model: Path
    out: Path
    steps: int
    env_map: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)
    """`agent_env`: more environment variables of the agent processes."""
    device: str = "auto"
    check_rollout: bool = False
    vllm_args: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    """The `config` keys, dotted."""
    base: Path = Path(".")
    """The file's folder: paths are relative to it, the agent imports from it."""

    def agent_env(self) -> dict[str, str]:
        """What the agent processes need in their environment: the file's folder on `PYTHONPATH`, the function."""
        path = os.pathsep.join(p for p in (str(self.base), os.environ.get("PYTHONPATH", "")) if p)
        env = {**self.extra_env, "PYTHONPATH": path}
        if self.agent_function:
            env["AGL_AGENT_FUNCTION"] = self.agent_function
        return env


def load_run_file(source: str | Path | Mapping[str, Any], out: Path | None = None) -> RunFile:
    """Read a run file (a path or its contents as a mapping) and check it: RunFileError names the field."""
    if isinstance(source, Mapping):
        where, base, raw = "<run config>", Path.cwd(), dict(source)
    else:
        path = Path(source)
        where, base = str(path), path.resolve().parent
        if not path.is_file():
            raise RunFileError(where, "(file)", "no such file")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise RunFileError(where, "(file)", f"not YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise RunFileError(where, "(file)", "must be a mapping of keys")
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise RunFileError(where, ", ".join(missing), f"required (the required keys: {', '.join(REQUIRED)})")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise RunFileError(
            where,
            ", ".join(unknown),
            f"unknown key; agl and verl keys go under `config:` (the file's keys: {', '.join(REQUIRED + OPTIONAL)})",
        )
    device = str(raw.get("device", "auto"))
    if device not in DEVICES:
        raise RunFileError(where, "device", f"one of {DEVICES}, got {device!r}")
    model = (base / str(raw["model"])).resolve()
    if not (model / "config.json").is_file():
        raise RunFileError(where, "model", f"{model} is not a Hugging Face model folder (no config.json)")
    tasks = read_tasks(raw["tasks"], "tasks", where, base)
    val_tasks = (
        read_tasks(raw["val_tasks"], "val_tasks", where, base) if "val_tasks" in raw else tasks[:DEFAULT_VAL_TASKS]
    )
    env_map = _string_map(raw.get("env_map") or {}, "env_map", where)
    check_env_map(env_map, tasks, "tasks", where)
    check_env_map(env_map, val_tasks, "val_tasks" if "val_tasks" in raw else "tasks", where)
    agent = str(raw["agent"])
    kind = probe_agent(agent, base, where)
    return RunFile(
        where=where,
        agent=agent,
        agent_class=FUNCTION_AGENT_CLASS if kind == "function" else agent,
        agent_function=agent if kind == "function" else None,
        tasks=tasks,
        val_tasks=val_tasks,
        model=model,
        out=(out or base / str(raw.get("out", f"runs/{_run_name(source)}"))).resolve(),
        steps=check_steps(raw.get("steps", DEFAULT_STEPS), where),
        env_map=env_map,
        extra_env={str(k): str(v) for k, v in _mapping(raw.get("agent_env") or {}, "agent_env", where).items()},
        device=device,
        check_rollout=bool(raw.get("check_rollout", False)),
        vllm_args=tuple(str(arg) for arg in raw.get("vllm_args") or ()),
        settings=flatten(raw.get("config") or {}, where),
        base=base,
    )


def check_steps(steps: Any, where: str) -> int:
    """`steps`, a positive number of training steps; RunFileError otherwise."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise RunFileError(where, "steps", f"a positive number of training steps, got {steps!r}")
    return steps


def probe_agent(spec: str, base: Path, where: str) -> str:
    """Import the agent as its processes will (in a fresh interpreter here, the file's folder on
    `PYTHONPATH`): `class` or `function`; RunFileError quotes the import's error."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(base), os.environ.get("PYTHONPATH")) if p)}
    result = subprocess.run(
        [sys.executable, "-c", AGENT_PROBE, spec], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RunFileError(
            where, "agent", f"{spec!r} does not import from {base}, {os.getcwd()} or PYTHONPATH: {detail}"
        )
    kind = result.stdout.strip().splitlines()[-1]
    if kind not in ("class", "function"):
        raise RunFileError(where, "agent", f"{spec!r} is a {kind}, not a class with run() or a function")
    return kind


def check_env_map(env_map: Mapping[str, str], tasks: list[dict[str, Any]], field: str, where: str) -> None:
    """Every task has every field `env_map` names; RunFileError names the variable and the first task without it."""
    for number, task in enumerate(tasks, start=1):
        for name, path in env_map.items():
            try:
                mapped_env(task, {name: path})
            except MissingInputField as exc:
                raise RunFileError(where, f"env_map.{name}", f"{field}: task {number}: {exc}") from None


def flatten(settings: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """Nested `config:` keys as dotted ones (`{a: {b: 1}}` → `{"a.b": 1}`); lists and empty mappings are values."""
    if not isinstance(settings, Mapping):
        raise RunFileError(where, f"config{prefix}", "a mapping of agl and verl keys")
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, where, name))
        else:
            flat[name] = value
    return flat


def _run_name(source: str | Path | Mapping[str, Any]) -> str:
    return "agl-train" if isinstance(source, Mapping) else Path(source).stem


def _string_map(value: Any, field: str, where: str) -> dict[str, str]:
    if not all(isinstance(v, str) for v in _mapping(value, field, where).values()):
        raise RunFileError(where, field, "a mapping of variable names to task fields (`NAME: input.field`)")
    return {str(k): v for k, v in value.items()}


def _mapping(value: Any, field: str, where: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise RunFileError(where, field, f"a mapping, got {type(value).__name__}")
    return value
