"""`agl proxy serve`: the proxy on the command line.

Registered through the `agl.commands` entry point group; `agl_store.cli.main` calls
`add_proxy_commands` with its subparsers.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
from dataclasses import dataclass
from typing import Any, get_args

from agl_store.models import RolloutMode
from agl_store.server import PAGE_SETTING_HELP, PageSettings, parse_page_settings
from agl_store.server import create_app as create_store_app
from agl_store.web.key_option import KeyOption

from ..common.deployments import ModelRegistry, with_aliases
from ..controls.pausing import DEFAULT_HOLD_S
from ..controls.sampling import MODE_FIELDS, ON_CONFLICT, checked_by_mode
from ..recording.exporter import DEFAULT_BACKPRESSURE_WAIT_S, DEFAULT_MAX_BUFFER
from .proxy import DEFAULT_PORT, LLMProxy
from .settings import TOKEN_CHAIN_MODES, ProxySettings

ROLLOUT_MODES = get_args(RolloutMode)

CLIENT_KEY = KeyOption("--key", "AGL_KEY", "bearer key of the LLM routes: what agents call with")
ADMIN_KEY = KeyOption(
    "--admin-key", "AGL_ADMIN_KEY", "bearer key of /proxy/*, /metrics and the embedded store (default: --key)"
)
STORE_KEY = KeyOption("--store-key", "AGL_STORE_KEY", "bearer key of the --store-url server (default: --admin-key)")


def add_proxy_commands(subparsers: Any) -> None:
    """Add `agl proxy serve` to the top-level subparsers."""
    proxy = subparsers.add_parser("proxy", help="the LLM proxy (OpenAI-compatible, records token-level spans)")
    commands = proxy.add_subparsers(dest="proxy_command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve the proxy (and, by default, an embedded store on the same port)")
    backends = serve.add_mutually_exclusive_group(required=True)
    backends.add_argument("--config", help="a YAML file with LiteLLM's `model_list`")
    backends.add_argument(
        "--backend", action="append", metavar="URL", help="an OpenAI-compatible (vLLM) base URL; repeat for replicas"
    )
    serve.add_argument("--model", help="with --backend: the model name clients use (and vLLM serves)")
    serve.add_argument("--backend-model", help="with --backend: the name vLLM serves, when it differs from --model")
    serve.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help="serve MODEL also as NAME, a name or a wildcard (e.g. 'claude-*=qwen', '*=qwen'): the model names "
        "agents send by default reach it; repeat",
    )
    stores = serve.add_mutually_exclusive_group()
    stores.add_argument("--store-url", help="a store server (http://host:4747) instead of the embedded store")
    stores.add_argument("--db", default="agl.db", help="embedded store: SQLite file path or store URL (default agl.db)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    for option in (CLIENT_KEY, ADMIN_KEY, STORE_KEY):
        option.add_to(serve)
    serve.add_argument("--advertise-url", help="the root URL agents reach this proxy at (default http://HOST:PORT)")
    serve.add_argument("--logprobs", action="store_true", help="ask backends for the sampled tokens' logprobs")
    serve.add_argument(
        "--token-chain",
        choices=TOKEN_CHAIN_MODES,
        default="auto",
        help="auto: chat calls to a vLLM started with --enable-scale-out are served token in, token out, each "
        "prompt bridged from the attempt's earlier calls; off: every backend renders its prompts",
    )
    serve.add_argument(
        "--require-token-ids",
        action="store_true",
        help="answer 502 to a call whose answer lacks token ids or has fewer than its usage counts",
    )
    serve.add_argument(
        "--sampling",
        action="append",
        default=[],
        metavar="MODE.FIELD=VALUE",
        help=(
            "sampling enforced on calls of rollouts of MODE (train, val, test, or all), e.g. train.temperature=1.0, "
            "val.temperature=0, all.max_tokens=256 (a cap), train.row_tokens=8192 (what a trajectory row holds); "
            f"fields: {', '.join(MODE_FIELDS)}; repeat"
        ),
    )
    serve.add_argument(
        "--sampling-conflict",
        choices=ON_CONFLICT,
        default="override",
        help="what an agent's conflicting explicit value gets: overridden (default) or a 400 (refuse)",
    )
    serve.add_argument(
        "--hold",
        type=_seconds,
        default=DEFAULT_HOLD_S,
        metavar="SECONDS",
        help=f"how long a call arriving during a pause waits for the resume before a 429 (default {DEFAULT_HOLD_S:g})",
    )
    serve.add_argument(
        "--span-buffer",
        type=positive_int,
        default=DEFAULT_MAX_BUFFER,
        help=(
            f"spans of answered calls that may wait for the store before new calls wait (default {DEFAULT_MAX_BUFFER})"
        ),
    )
    serve.add_argument(
        "--backpressure-wait",
        type=_seconds,
        default=DEFAULT_BACKPRESSURE_WAIT_S,
        metavar="SECONDS",
        help=(
            "how long a new call waits for room in the span buffer before a 503 "
            f"(default {DEFAULT_BACKPRESSURE_WAIT_S:g})"
        ),
    )
    serve.add_argument("--page-setting", action="append", default=[], metavar="NAME.KEY=VALUE", help=PAGE_SETTING_HELP)
    serve.set_defaults(run=_serve)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def sampling_from_args(settings: list[str]) -> dict[str, dict[str, float | int]]:
    """The `--sampling MODE.FIELD=VALUE` flags as a by-mode table; ValueError names a bad one."""
    by_mode: dict[str, dict[str, Any]] = {}
    for setting in settings:
        target, sep, text = setting.partition("=")
        mode, dot, name = target.partition(".")
        if not (sep and dot and mode and name):
            raise ValueError(f"--sampling {setting!r:.60} is not MODE.FIELD=VALUE (e.g. train.temperature=1.0)")
        if mode != "all" and mode not in ROLLOUT_MODES:
            raise ValueError(f"--sampling {setting!r:.60}: the mode must be one of {', '.join(ROLLOUT_MODES)} or all")
        try:
            value: Any = float(text)
        except ValueError:
            raise ValueError(f"--sampling {setting!r:.60}: {text!r:.30} is not a number") from None
        by_mode.setdefault(mode, {})[name] = value
    return checked_by_mode(by_mode, "--sampling")


def model_list_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The LiteLLM `model_list` that `--config` or `--backend/--model` describe, with the aliases of
    `--alias` and of the config's `router_settings.model_group_alias` (LiteLLM's key)."""
    model_list, aliases = _configured_models(args)
    for setting in args.alias:
        alias, sep, target = setting.partition("=")
        if not (sep and alias and target):
            raise ValueError(f"--alias {setting!r:.80} is not NAME=MODEL (e.g. 'claude-*=qwen')")
        aliases[alias] = target
    return with_aliases(model_list, aliases)


def _configured_models(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if args.config:
        import yaml

        with open(args.config, encoding="utf-8") as handle:
            config = yaml.safe_load(handle) or {}
        model_list = config.get("model_list") if isinstance(config, dict) else None
        if not isinstance(model_list, list):
            raise ValueError(f"{args.config} has no `model_list:` list (LiteLLM's config format)")
        return model_list, _config_aliases(config.get("router_settings"), args.config)
    if not args.model:
        raise ValueError("--backend needs --model NAME (the model name vLLM serves)")
    entries = []
    for url in args.backend:
        url = url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        params = {"model": f"hosted_vllm/{args.backend_model or args.model}", "api_base": url}
        entries.append({"model_name": args.model, "litellm_params": params})
    return entries, {}


def _config_aliases(router_settings: Any, where: str) -> dict[str, str]:
    """`router_settings.model_group_alias`: {alias: model} or {alias: {model: ...}}, as LiteLLM reads it."""
    aliases = (router_settings or {}).get("model_group_alias") if isinstance(router_settings, dict) else None
    out: dict[str, str] = {}
    for alias, target in (aliases or {}).items():
        model = target.get("model") if isinstance(target, dict) else target
        if not isinstance(alias, str) or not isinstance(model, str):
            raise ValueError(
                f"{where}: router_settings.model_group_alias.{alias} must name a model, got {target!r:.80}"
            )
        out[alias] = model
    return out


@dataclass(frozen=True)
class Keys:
    """The keys `agl proxy serve` was given, resolved to their defaults."""

    client: str | None
    admin: str | None
    store: str | None
    sources: str
    """For the listening line: where each key came from (never the key)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Keys:
        client, client_from = CLIENT_KEY.read(args)
        admin, admin_from = ADMIN_KEY.read(args)
        store, store_from = STORE_KEY.read(args)
        if client and not admin:
            sources = f"one key for agents and admin routes, from {client_from} (give --admin-key to keep agents out)"
        elif admin:
            clients = f"agents' key from {client_from}" if client else "LLM routes open"
            sources = f"{clients}; admin key from {admin_from}"
        else:
            sources = "no key"
        admin = admin or client
        if store and args.store_url:
            sources += f"; store key from {store_from}"
        return cls(client=client, admin=admin, store=store or admin, sources=sources)


def settings_from_args(args: argparse.Namespace) -> ProxySettings:
    """The proxy's settings that the flags give; ValueError names a bad flag."""
    return ProxySettings(
        logprobs=args.logprobs,
        sampling_by_mode=sampling_from_args(args.sampling),
        sampling_on_conflict=args.sampling_conflict,
        require_token_ids=args.require_token_ids,
        token_chain=args.token_chain,
        hold_s=args.hold,
        max_span_buffer=args.span_buffer,
        backpressure_wait_s=args.backpressure_wait,
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        model_list = model_list_from_args(args)
        ModelRegistry(model_list)  # a bad entry fails here, before the store is opened
        keys = Keys.from_args(args)
        settings = settings_from_args(args)
        page_settings = parse_page_settings(args.page_setting)
    except (OSError, ValueError) as exc:
        print(f"agl proxy serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve_async(args, model_list, keys, settings, page_settings))
    return uvloop.run(_serve_async(args, model_list, keys, settings, page_settings))


async def _serve_async(
    args: argparse.Namespace,
    model_list: list[dict[str, Any]],
    keys: Keys,
    settings: ProxySettings,
    page_settings: PageSettings,
) -> int:
    from agl_store.opening import db_url, open_store

    store_url = args.store_url or db_url(args.db)
    store = await open_store(store_url, key=keys.store)
    # With --store-url too: the trainer reaches the store through `agl_base_url`, the proxy's URL.
    try:
        store_app: Any = create_store_app(
            store, key=keys.admin, manage_store=False, page_settings=page_settings, host=args.host
        )
    except ValueError as exc:  # a pages plug-in refused its settings
        await store.close()
        print(f"agl proxy serve: {exc}", file=sys.stderr)
        return 2
    proxy = LLMProxy(
        model_list,
        store,
        host=args.host,
        port=args.port,
        key=keys.client,
        admin_key=keys.admin,
        settings=settings,
        store_app=store_app,
        advertise_url=args.advertise_url,
    )
    # Before the proxy starts, so that these stay the handlers while it serves and after it stops.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await proxy.start()
    except (RuntimeError, OSError) as exc:
        await store.close()
        print(f"agl proxy serve: cannot listen on {args.host}:{args.port}: {exc.__cause__ or exc}", file=sys.stderr)
        return 1
    models = ", ".join(proxy.state.registry.model_names)
    where = f"store {store_url} (its routes served here too)"
    advertised = f"; agents use {proxy.url}" if args.advertise_url else ""
    details = f"models: {models}; {where}; {keys.sources}{advertised}"
    print(f"agl proxy serve: listening on {proxy.bound_url} ({details})", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.stop()
        await store.close()
    print("agl proxy serve: stopped", flush=True)
    return 0
