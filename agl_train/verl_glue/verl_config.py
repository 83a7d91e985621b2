"""verl keys that agl's training loop cannot honour, refused before verl builds anything, and the
vLLM server flags agl's overlay passes through verl.

agl's loop (`AglTrainer.fit`) computes the advantage per rollout from the rollout's final reward
before any log-prob is computed, and builds no critic. verl keys that need something else would
fail after a whole step of rollouts, or, worse, be ignored; `check_verl_config(config)` raises a
ValueError naming the key and the value to set instead.

verl starts its vLLM servers with `actor_rollout_ref.rollout.engine_kwargs.vllm` as extra CLI
arguments (`vllm_async_server.launch_server`). Without a tool-call parser vLLM answers every
request that carries `tools` with 400, so agl's overlay fills those arguments from
`agentlightning.tool_call_parser` (`tool_call_server_args`, through the `agl.auto_tool_choice`
resolver registered on import); the CPU test server takes its flags from the same function. The
overlay also sets `enable_scale_out` (the `agl.scale_out` resolver) where the installed vLLM takes
it, so that verl's servers serve the token-in endpoints the proxy's token chain calls
(docs/proxy.md, "Token chain"); a vLLM without the flag starts without it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

_MISSING = object()

TOOL_CALL_PARSER_KEY = "agentlightning.tool_call_parser"


def tool_call_server_args(parser: str | None) -> dict[str, Any]:
    """vLLM server arguments (as verl's `engine_kwargs.vllm` keys) that turn tool calling on with
    `parser` (`hermes`, `llama3_json`, ... : vLLM's `--tool-call-parser`), or off for None."""
    if parser is not None and (not isinstance(parser, str) or not parser):
        raise ValueError(f"{TOOL_CALL_PARSER_KEY} must be a vLLM tool-call parser name or null, got {parser!r}")
    return {"enable_auto_tool_choice": parser is not None, "tool_call_parser": parser}


def default_tool_call_parser() -> str | None:
    """`agentlightning.tool_call_parser` as agl_train/config.yaml sets it (read without Hydra)."""
    from importlib.resources import files

    import yaml

    overlay = yaml.safe_load(files("agl_train").joinpath("config.yaml").read_text(encoding="utf-8"))
    parser: str | None = overlay["agentlightning"]["tool_call_parser"]
    return parser


def tool_call_cli_args(parser: str | None) -> list[str]:
    """`tool_call_server_args` as `vllm serve` flags, for servers started outside verl."""
    flags: list[str] = []
    for key, value in tool_call_server_args(parser).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


@functools.cache
def scale_out_server_arg() -> bool | None:
    """`engine_kwargs.vllm.enable_scale_out`: True where the installed vLLM's server takes
    `--enable-scale-out` (vLLM 0.31 does), None elsewhere (verl then leaves the flag out, and a
    vLLM that would refuse it starts; the proxy then renders the prompts)."""
    try:
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
    except ImportError:
        return None
    return True if "enable_scale_out" in {f.name for f in dataclasses.fields(FrontendArgs)} else None


# config.yaml interpolates engine_kwargs.vllm.enable_auto_tool_choice from the parser with it.
OmegaConf.register_new_resolver(
    "agl.auto_tool_choice", lambda parser: tool_call_server_args(parser)["enable_auto_tool_choice"], replace=True
)
OmegaConf.register_new_resolver("agl.scale_out", scale_out_server_arg, replace=True)

ESTIMATOR_KEY = "algorithm.adv_estimator"

REFUSED_ESTIMATORS = {
    "gae": "needs a critic's values, and agl's rollout-level advantage has one scalar per rollout",
    "remax": "needs a greedy baseline rollout per prompt, which agl's runners do not run",
    "optimal_token_baseline": "needs old log-probs before the advantage; agl computes the advantage first",
    "tir_optimal_token_baseline": "needs old log-probs before the advantage; agl computes the advantage first",
    "gdpo": "needs per-component rewards (algorithm.gdpo_reward_keys), which agl's reward spans do not carry",
}
"""verl estimators agl's step cannot feed, with the reason."""


@dataclass(frozen=True)
class Refused:
    """A verl key whose values other than `allowed` agl's loop does not implement."""

    key: str
    allowed: tuple[Any, ...]
    why: str

    def accepts(self, value: Any) -> bool:
        return value is _MISSING or value in self.allowed


REFUSED_KEYS: tuple[Refused, ...] = (
    Refused("critic.enable", (False, None), "agl trains the actor only (no critic, no value estimates)"),
    Refused(
        "algorithm.use_kl_in_reward",
        (False, None),
        "the advantage is computed before old log-probs; use actor_rollout_ref.actor.use_kl_loss",
    ),
    Refused("trainer.critic_warmup", (0,), "critic warm-up steps need a critic, which agl does not build"),
    Refused(
        "algorithm.rollout_correction.bypass_mode",
        (False,),
        "bypass mode replaces the old log-probs with the sampling ones and agl's per_rollout_mean loss "
        "with verl's bypass_mode loss; agl recomputes the old log-probs and corrects against the "
        "sampling ones with rollout_is / rollout_rs",
    ),
    Refused("algorithm.filter_groups.enable", (False,), "agl trains every completed group; it does not refill batches"),
    Refused("algorithm.use_pf_ppo", (False,), "agl does not reweight its rows"),
    Refused(
        "data.gen_batch_size",
        (None,),
        "agl's step schedule draws batches of data.train_batch_size prompts",
    ),
    Refused(
        "trainer.validation_data_dir",
        (None,),
        "agl's validation reads rewards from the store; the spans of validation rollouts are there",
    ),
    Refused("trainer.log_val_generations", (0,), "agl's validation logs rewards, not generations"),
    Refused(
        "trainer.use_v1",
        (False,),
        "AglTrainer extends verl's legacy RayPPOTrainer and its worker groups, not verl's v1 trainer",
    ),
    Refused(
        "global_profiler.steps",
        (None,),
        "agl's loop does not start or stop verl's profiler around its steps",
    ),
    Refused(
        "trainer.esi_redundant_time",
        (0,),
        "agl saves every trainer.save_freq steps and at the last step; it does not force a save "
        "before an elastic instance expires",
    ),
    Refused(
        "actor_rollout_ref.actor.checkpoint.async_save",
        (False, None),
        "agl's loop does not finalise asynchronous saves, so such a checkpoint would never be marked complete",
    ),
    Refused(
        "distillation.enabled",
        (False, None),
        "agl builds no teacher model workers; init_workers would fail after Ray started",
    ),
)
"""verl keys agl refuses unless they keep their default (the first allowed value)."""


def select(config: Any, dotted: str, default: Any = _MISSING) -> Any:
    """The value at a dotted key of a DictConfig or nested dicts; `default` when a part is missing."""
    node = config
    for part in dotted.split("."):
        getter: Callable[[str, Any], Any] | None = getattr(node, "get", None)
        if getter is None:
            return default
        node = getter(part, _MISSING)
        if node is _MISSING:
            return default
    return node


def check_verl_config(config: Any) -> None:
    """ValueError naming the first verl key set to something agl's loop would not honour."""
    estimator = str(select(config, ESTIMATOR_KEY, "gae"))
    if estimator in REFUSED_ESTIMATORS:
        raise ValueError(
            f"{ESTIMATOR_KEY}={estimator} is not supported by agl's trainer: {REFUSED_ESTIMATORS[estimator]}; "
            f"set {ESTIMATOR_KEY}=grpo (or rloo, reinforce_plus_plus_baseline, grpo_passk, ...)"
        )
    tool_call_server_args(select(config, TOOL_CALL_PARSER_KEY, None))
    for refused in REFUSED_KEYS:
        value = select(config, refused.key)
        if not refused.accepts(value):
            raise ValueError(
                f"{refused.key}={_yaml(value)} is not supported by agl's trainer: {refused.why}; "
                f"set {refused.key}={_yaml(refused.allowed[0])}"
            )


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


__all__ = [
    "REFUSED_ESTIMATORS",
    "REFUSED_KEYS",
    "TOOL_CALL_PARSER_KEY",
    "Refused",
    "check_verl_config",
    "default_tool_call_parser",
    "scale_out_server_arg",
    "select",
    "tool_call_cli_args",
    "tool_call_server_args",
]
