"""Run `AglTrainer.fit()` on the CPU: the parts of verl 0.9.1 that need CUDA, replaced for the CPU.

verl's worker stack assumes an accelerator: its resource pools ask Ray for GPUs, its training engine
is registered for cuda/npu only, its device layer knows no CPU, and the trained weights reach vLLM
through CUDA IPC / NCCL into vLLM replicas that verl starts itself. This module replaces exactly
those pieces and nothing else:

| verl piece | replaced by |
| --- | --- |
| the platform (`verl.plugin.platform`: cuda/npu/rocm) | `CpuPlatform`, set with verl's `set_platform` in each worker |
| `ResourcePoolManager` (one GPU per worker) | `CpuResourcePoolManager`: the same pools, one CPU per worker |
| `FSDPEngineWithLMHead` on cuda/npu | `CpuEngine`: verl's FSDP engine over gloo, in float32 |
| `LLMServerManager` (vLLM replicas verl starts) | `ExternalReplicas`: vLLM servers started elsewhere |
| `CheckpointEngineManager` (NCCL/IPC weight push) | `DiskWeightSync`: safetensors + vLLM's `reload_weights` |

Two ways to run, both with verl's own `ActorRolloutRefWorker` code (`workers.AglWorker`):

- distributed: `entry.run_ppo(config, train, val, rollout=ExternalRollout(addresses, weights_dir))`
  with `trainer.device=cpu` and `trainer.n_gpus_per_node=N`: a local Ray cluster, verl's
  `RayWorkerGroup` of N worker processes in a CPU resource pool, FSDP sharding the actor across them.
- one process: `cpu_run.run_ppo_on_cpu(config, train, val, addresses, weights_dir)`: the worker built in
  this process (`cpu_run.LocalWorkerGroup`, world size 1, the model unwrapped), no Ray. It starts in seconds
  instead of the half minute or more of a Ray cluster and its worker processes, which the CI's
  learning test (tests/train/test_fit_cpu.py, 16 steps) would pay on two cores.

Everything else is verl's own code, run for real: `ActorRolloutRefWorker.init_model`, the
`TrainingWorker`'s mini-batch iteration, the engine's micro-batching, forward, log-prob / entropy,
backward, grad clipping and optimizer step, `ppo_loss` with the registered `per_rollout_mean`
policy loss, `get_per_tensor_param`, the FSDP checkpoint, and `RayPPOTrainer._compute_old_log_prob`
/ `_update_actor` / `_balance_batch`.

The vLLM servers must serve a copy of `actor_rollout_ref.model.path` with `VLLM_SERVER_DEV_MODE=1`
(for `/collective_rpc` and `/reset_prefix_cache`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from ..runner.proxy_control import server_root
from ._verl import (
    EngineRegistry,
    FSDPEngineWithLMHead,
    PlatformBase,
    RayResourcePool,
    ResourcePoolManager,
    platform_manager,
)

logger = logging.getLogger(__name__)

RELOAD_TIMEOUT_S = 300.0


class _CpuDeviceModule(types.ModuleType):
    """`torch.cpu` plus the `torch.cuda`-style calls verl makes on its device module (memory
    statistics, seeding, cache), which the CPU answers with zeros and no-ops."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # verl's FLOPs table key for the CPU

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)  # verl's checkpoint loader restores the device's RNG through this


class CpuPlatform(PlatformBase):
    """verl's device abstraction for the CPU: device `cpu`, collective backend `gloo`."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CpuDeviceModule("agl_cpu_device")

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return "cpu"  # what verl passes to `.to(...)`

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


CPU_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
"""FSDP's mixed precision on the CPU: float32 throughout (verl's default computes in bf16)."""


class CpuEngine(FSDPEngineWithLMHead):
    """verl's FSDP language-model engine on the CPU. With one process the model is left
    unwrapped (nothing to shard); with more, verl's own FSDP wrapping shards it over the gloo
    group, with `CPU_PRECISION` (`cpu_precision` sets it in the worker's config). Everything else
    (micro-batches, forward, log-probs, backward, clipping, optimizer, lr scheduler,
    `get_per_tensor_param`, checkpoints) is the FSDP engine's own code."""

    def _build_fsdp_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if torch.distributed.get_world_size() > 1:
            if self.engine_config.strategy != "fsdp2":
                # verl wraps FSDP1 with sync_module_states=True, which torch refuses for CPU tensors.
                raise ValueError(
                    f"actor_rollout_ref.actor.strategy={self.engine_config.strategy} cannot shard on the CPU "
                    "(FSDP1's sync_module_states needs GPU tensors); set actor_rollout_ref.actor.strategy=fsdp2"
                )
            return super()._build_fsdp_module(module)
        self._autocast_dtype = torch.float32  # the engine then runs without autocast
        self.scaler = None
        return module


def cpu_precision(actor_rollout_ref: Any) -> None:
    """Train and score in float32 on the CPU unless `actor_rollout_ref.{actor,ref}.fsdp_config.mixed_precision`
    is set: bf16 buys a CPU nothing, and the actor's log-probs must match vLLM's float32 ones."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(actor_rollout_ref):
        for role in ("actor", "ref"):
            key = f"{role}.fsdp_config.mixed_precision"
            if OmegaConf.select(actor_rollout_ref, key) is None:
                OmegaConf.update(actor_rollout_ref, key, dict(CPU_PRECISION), force_add=True)


def use_cpu() -> None:
    """Point verl at the CPU in this process: the CPU platform, `CpuEngine` for `fsdp`/`fsdp2` on
    `cpu`, and the gloo group. In a Ray worker the group is the worker group's (verl's
    `RayWorkerGroup` sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT); alone, a one-process
    group on a free local port (what `torchrun` would set up)."""
    if platform_manager.get_platform().device_name != "cpu":
        platform_manager.set_platform(CpuPlatform())
    try:
        registered = EngineRegistry.get_engine_cls("language_model", "fsdp")
    except ValueError:  # nothing registered for the cpu device yet
        registered = None
    if registered is not CpuEngine:
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(CpuEngine)
    if not torch.distributed.is_initialized():
        # verl's Worker reads the torchrun variables; a one-process group needs them to say rank 0 of 1.
        for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1"}.items():  # fmt: skip
            os.environ.setdefault(name, value)
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
        torch.distributed.init_process_group(
            "gloo",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica:
    """One vLLM server, as the trainer sees a verl rollout replica (`server_address`)."""

    def __init__(self, server_address: str) -> None:
        self.server_address = server_address


class ExternalReplicas:
    """Stands in for verl's `LLMServerManager`: vLLM servers started elsewhere."""

    def __init__(self, server_addresses: Sequence[str]) -> None:
        self._replicas = [Replica(address) for address in server_addresses]

    def get_replicas(self) -> list[Replica]:
        return list(self._replicas)


@dataclass(frozen=True)
class ExternalRollout:
    """Where the trainer's rollouts run when verl does not start its vLLM replicas: the servers'
    `host:port` addresses, and the folder the weights go through on their way to them."""

    server_addresses: Sequence[str]
    weights_dir: Path


class DiskWeightSync:
    """Stands in for verl's `CheckpointEngineManager`: after an update the actor's weights are
    written as safetensors under `weights_dir/step_<k>` (by the actor's worker group:
    `save_rollout_weights`, rank 0 writing what all ranks gather), then every replica loads them in place
    with vLLM's `reload_weights` (`POST /collective_rpc`) and drops its prefix cache (KV computed
    with the old weights). The server keeps running; the trainer pauses and drains the proxy
    around the switch, so no request sees half-loaded weights.
    """

    def __init__(
        self,
        actor: Any,
        replicas: ExternalReplicas,
        weights_dir: Path,
        timeout_s: float = RELOAD_TIMEOUT_S,
    ) -> None:
        self.actor = actor
        self.replicas = replicas
        self.weights_dir = Path(weights_dir)
        self.timeout_s = timeout_s
        self.synced_step: int | None = None

    def sleep_replicas(self) -> None:
        """Nothing to free on the CPU: the replicas keep serving until the proxy is paused."""
        return None

    def abort_replicas(self) -> None:
        """Nothing to abort: these servers are vLLM's OpenAI servers, which stop a request when its
        client (the proxy, which cancelled the call) disconnects."""
        return None

    def resume_generation_replicas(self) -> None:
        """Nothing to resume: `abort_replicas` paused nothing."""
        return None

    def update_weights(self, global_steps: int) -> dict[str, float]:
        target = self.weights_dir / f"step_{global_steps}"
        staging = self.weights_dir / f".step_{global_steps}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self.actor.save_rollout_weights(str(staging.resolve()))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        with httpx.Client(timeout=self.timeout_s) as http:
            for replica in self.replicas.get_replicas():
                root = server_root(replica.server_address)
                answer = http.post(
                    root + "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(target)}}
                )
                _raise_for(answer, root, "reload_weights")
                _raise_for(http.post(root + "/reset_prefix_cache"), root, "reset_prefix_cache")
        if self.synced_step is not None and self.synced_step != global_steps:
            shutil.rmtree(self.weights_dir / f"step_{self.synced_step}", ignore_errors=True)
        self.synced_step = global_steps
        logger.info("weights of step %d loaded by %d vLLM replica(s)", global_steps, len(self.replicas.get_replicas()))
        return {}


def _raise_for(answer: httpx.Response, root: str, what: str) -> None:
    if answer.status_code == 404:
        raise RuntimeError(f"{root} has no {what} endpoint: start vLLM with VLLM_SERVER_DEV_MODE=1")
    if answer.status_code >= 400:
        raise RuntimeError(f"{what} on {root} answered {answer.status_code}: {answer.text[:500]}")


class CpuResourcePoolManager(ResourcePoolManager):
    """verl's `ResourcePoolManager` with its pools on CPUs: the one change agl makes to verl's
    placement. verl's `create_resource_pool` builds `RayResourcePool(use_gpu=True)` (a GPU in
    every bundle) and checks the cluster's GPUs; here each of a pool's processes gets a bundle of
    one CPU, and `RayWorkerGroup` (which reads `use_gpu` from the pool) places its workers there."""

    def create_resource_pool(self) -> None:
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes, use_gpu=False, max_colocate_count=1, name_prefix=name
            )


__all__ = [
    "CPU_PRECISION",
    "CpuEngine",
    "CpuPlatform",
    "CpuResourcePoolManager",
    "DiskWeightSync",
    "ExternalReplicas",
    "ExternalRollout",
    "Replica",
    "cpu_precision",
    "use_cpu",
]
