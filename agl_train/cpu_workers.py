"""Run `AglTrainer.fit()` on the CPU: an in-process stand-in for the parts of verl 0.9.1 that need CUDA.

verl's worker stack cannot start on a CPU: its workers are Ray actors placed on GPUs, its training
engine wraps the model in FSDP (registered for cuda/npu only), its device layer knows no CPU, and the
trained weights reach vLLM through CUDA IPC / NCCL into vLLM replicas that verl starts itself. This
module replaces exactly those pieces and nothing else:

| verl piece | replaced by |
| --- | --- |
| the platform (`verl.plugin.platform`: cuda/npu/rocm) | `CpuPlatform`, set with verl's `set_platform` |
| `RayWorkerGroup` of `ActorRolloutRefWorker`s | `LocalWorkerGroup`: one `ActorRolloutRefWorker` in this process |
| FSDP wrapping in `FSDPEngineWithLMHead` | `CpuEngine`: the same engine with the HF model left unwrapped |
| `LLMServerManager` (vLLM replicas verl starts) | `ExternalReplicas`: vLLM servers started elsewhere |
| `CheckpointEngineManager` (NCCL/IPC weight push) | `DiskWeightSync`: safetensors + vLLM's `reload_weights` |

Everything else is verl's own code, run for real: `ActorRolloutRefWorker.init_model`, the
`TrainingWorker`'s mini-batch iteration (`train_mini_batch`), the engine's micro-batching, forward,
log-prob / entropy, backward, grad clipping and optimizer step, `ppo_loss` with the registered
`per_rollout_mean` policy loss, and `RayPPOTrainer._compute_old_log_prob` / `_update_actor`.

```python
trainer = run_ppo_on_cpu(config, train_tasks, val_tasks, ["127.0.0.1:8000"], weights_dir=Path("weights"))
```

is `agl_train.entry.run_ppo` without Ray: the same checks and `AglTrainer`, with
`init_cpu_workers(trainer, ...)` in place of `trainer.init_workers()`, then `trainer.fit()`.

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
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from .proxy_control import server_root

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

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


class CpuEngine(FSDPEngineWithLMHead):
    """verl's FSDP language-model engine with the model left unwrapped: one process holds the
    whole model in float32, so there is nothing to shard and no mixed precision to apply.
    Everything else (micro-batches, forward, log-probs, backward, clipping, optimizer,
    lr scheduler, `get_per_tensor_param`) is the FSDP engine's own code."""

    def _build_fsdp_module(self, module: torch.nn.Module) -> torch.nn.Module:
        self._autocast_dtype = torch.float32  # the engine then runs without autocast
        self.scaler = None
        return module


def use_cpu() -> None:
    """Point verl at the CPU: the CPU platform, `CpuEngine` for `fsdp`/`fsdp2` on `cpu`, and a
    one-process gloo group (what `torchrun` would set up, on a free local port)."""
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
            "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalWorkerGroup:
    """Stands in for verl's `RayWorkerGroup`: the same `ActorRolloutRefWorker`, built in this
    process (world size 1), called directly instead of through Ray's dispatch and collect."""

    def __init__(self, actor_rollout_ref_config: Any, role: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from verl.workers.engine_workers import ActorRolloutRefWorker

        self.worker = ActorRolloutRefWorker(actor_rollout_ref_config, role=role)
        self.worker.init_model()
        self.world_size = 1
        # verl's trainer caches each role's data-parallel ranks here (`_get_dp_size`, used by `balance_batch`).
        self._dispatch_info: dict[str, list[int]] = {}

    def _query_dispatch_info(self, role: str) -> list[int]:
        """The data-parallel rank of each worker: one worker, rank 0."""
        return [0]

    @property
    def model(self) -> torch.nn.Module:
        """The trained HF model (the actor's, or the reference's for a `ref` group)."""
        training_worker = self.worker.actor if self.worker.actor is not None else self.worker.ref
        return training_worker.engine.module

    def compute_log_prob(self, data: Any) -> Any:
        return self.worker.compute_log_prob(data)

    def compute_ref_log_prob(self, data: Any) -> Any:
        return self.worker.compute_ref_log_prob(data)

    def update_actor(self, data: Any) -> Any:
        return self.worker.update_actor(data)

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.worker.save_checkpoint(*args, **kwargs)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.worker.load_checkpoint(*args, **kwargs)

    def per_tensor_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's weights under their HF names, from the engine's `get_per_tensor_param`
        (what verl's weight sync sends to vLLM)."""
        params, _ = self.worker.actor.engine.get_per_tensor_param()
        return iter(params)


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


class DiskWeightSync:
    """Stands in for verl's `CheckpointEngineManager`: after an update the actor's weights are
    written as safetensors under `weights_dir/step_<k>`, then every replica loads them in place
    with vLLM's `reload_weights` (`POST /collective_rpc`) and drops its prefix cache (KV computed
    with the old weights). The server keeps running; the trainer pauses and drains the proxy
    around the switch, so no request sees half-loaded weights.
    """

    def __init__(
        self,
        actor: LocalWorkerGroup,
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

    def update_weights(self, global_steps: int) -> dict[str, float]:
        from safetensors.torch import save_file

        target = self.weights_dir / f"step_{global_steps}"
        staging = self.weights_dir / f".step_{global_steps}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in self.actor.per_tensor_params()}
        save_file(tensors, str(staging / "model.safetensors"))
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


def init_cpu_workers(trainer: Any, server_addresses: Sequence[str], weights_dir: Path) -> None:
    """What `RayPPOTrainer.init_workers()` sets up, in this process on the CPU: the actor (and the
    reference policy when the config needs one) as local workers, the vLLM servers at
    `server_addresses` as the rollout replicas, and the weight sync to them through `weights_dir`."""
    use_cpu()
    actor = LocalWorkerGroup(trainer.config.actor_rollout_ref, role="actor")
    trainer.actor_rollout_wg = actor
    if trainer.use_reference_policy:
        trainer.ref_policy_wg = LocalWorkerGroup(trainer.config.actor_rollout_ref, role="ref")
    trainer.llm_server_manager = ExternalReplicas(server_addresses)
    trainer.checkpoint_manager = DiskWeightSync(actor, trainer.llm_server_manager, weights_dir)


def run_ppo_on_cpu(
    config: Any,
    train_dataset: Sequence[Any],
    val_dataset: Sequence[Any],
    server_addresses: Sequence[str],
    weights_dir: Path,
) -> Any:
    """Train like `agl_train.entry.run_ppo`, in this process on the CPU, against the vLLM servers at
    `server_addresses`; returns the trainer after `fit()` (its `actor_rollout_wg.model` is the
    trained model)."""
    from omegaconf import OmegaConf

    from .entry import build_trainer, check_inputs
    from .verl_loss import register_per_rollout_loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.ray_trainer import ResourcePoolManager, Role

    train, val = check_inputs(config, train_dataset, val_dataset)
    register_per_rollout_loss()
    config = config.copy()
    OmegaConf.resolve(config)
    trainer = build_trainer(
        config,
        train,
        val,
        # Only read by verl's constructor here: init_cpu_workers builds the workers itself.
        role_worker_mapping={Role.ActorRollout: LocalWorkerGroup},
        resource_pool_manager=ResourcePoolManager(
            resource_pool_spec={"global_pool": [1]}, mapping={Role.ActorRollout: "global_pool"}
        ),
    )
    init_cpu_workers(trainer, server_addresses, weights_dir)
    trainer.fit()
    return trainer


__all__ = [
    "CpuEngine",
    "CpuPlatform",
    "DiskWeightSync",
    "ExternalReplicas",
    "LocalWorkerGroup",
    "Replica",
    "init_cpu_workers",
    "run_ppo_on_cpu",
    "use_cpu",
]
