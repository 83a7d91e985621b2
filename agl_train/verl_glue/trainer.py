"""`AglTrainer`: verl's PPO trainer with rollouts through agl's proxy and store (docs/trainer.md).

A `RayPPOTrainer` whose `fit()` runs the steps of `schedule.StepSchedule`: each step it publishes
the rollout engine's replicas to the proxy, runs the data path (`step.rollout_step`), pauses and
drains the proxy around the weight update (`proxy_control.pause_for_update`: the token chain's
calls in flight stop and continue after it, by `agentlightning.update_in_flight`; the rest are
waited for up to `agentlightning.update_drain_timeout_seconds`), and updates the actor through verl. The proxy
applies the rollout's sampling parameters to every call (`ProxyControl.set_sampling`) and each
step checks from the spans that they did. Checkpoints (saved before `update_weights`, as verl)
carry the prompts drawn but not trained and the groups in flight, which a resume takes back.
"""

from __future__ import annotations

import json
import logging
import os
import random
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from agl_store.base import LightningStore
from agl_store.models import RolloutConfig

from ..core.aggregate import LEVEL_TRAJECTORY
from ..runner.dispatch import WORKER_ID, RolloutDispatcher
from ..runner.factory import make_runner
from ..runner.groups import GroupTracker
from ..runner.loop_thread import LoopThread
from ..runner.ownership import RunIdentity, take_over
from ..runner.proxy_control import (
    IN_FLIGHT_AT_UPDATE,
    ROW_TOKENS,
    ProxyControl,
    pause_for_update,
    publish_replicas,
)
from ..runner.retention import after_checkpoint
from ._verl import (
    DataProto,
    RayPPOTrainer,
    Tracking,
    agg_loss,
    calculate_debug_metrics,
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    marked_timer,
    reduce_metrics,
)
from .config import trainer_settings
from .correction import apply_rollout_correction, check_rollout_correction
from .dataset import INPUT_KEY
from .hooks import run_batch_hook, run_startup_hooks
from .schedule import StepPlan, StepSchedule, schedule_for
from .step import WAIT_GRACE_S, StepData, read_succeeded, rollout_step
from .workers import check_worker_config, init_worker_groups

logger = logging.getLogger(__name__)

CARRIED_FILE = "agl_carried.json"
"""In a checkpoint's `global_step_<k>` folder: what was drawn but not yet trained, as
`{"in_flight": [{"uid", "input", "rollout_ids"}, ...], "pending": [prompt, ...]}`, with the run's
id (`run_id`: a resume is the same run, `runner.ownership`) and its schedule (`schedule`:
`StepSchedule.resume_key`, which a resume must keep)."""
DRAIN_TIMEOUT_KEY = "update_drain_timeout_seconds"
DEFAULT_DRAIN_TIMEOUT_S = 60.0
HOLD_KEY = "update_hold_seconds"
DEFAULT_HOLD_S = 3600.0


def _positive_seconds(config: Any, key: str, default: float) -> float:
    value = config.agentlightning.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"agentlightning.{key} must be a positive number of seconds, got {value!r}")
    return float(value)


def drain_timeout_s(config: Any) -> float:
    """`agentlightning.update_drain_timeout_seconds` (positive; ValueError names the key)."""
    return _positive_seconds(config, DRAIN_TIMEOUT_KEY, DEFAULT_DRAIN_TIMEOUT_S)


IN_FLIGHT_KEY = "update_in_flight"


def update_in_flight(config: Any) -> str:
    """`agentlightning.update_in_flight`: what a weight update does with the calls in flight,
    one of `IN_FLIGHT_AT_UPDATE` (ValueError names the key)."""
    value = config.agentlightning.get(IN_FLIGHT_KEY, "continue")
    if value not in IN_FLIGHT_AT_UPDATE:
        raise ValueError(
            f"agentlightning.{IN_FLIGHT_KEY} must be one of {', '.join(IN_FLIGHT_AT_UPDATE)}, got {value!r}"
        )
    return str(value)


def update_hold_s(config: Any) -> float:
    """`agentlightning.update_hold_seconds`: how long the proxy holds calls that arrive while the
    trainer updates and checkpoints (positive; ValueError names the key)."""
    return _positive_seconds(config, HOLD_KEY, DEFAULT_HOLD_S)


class AglTrainer(RayPPOTrainer):
    """verl's PPO trainer with agent rollouts through agl's gateway.

    Construct it like `RayPPOTrainer` (the entry point does) with an `InMemoryDataset` and
    `collate_inputs`. The constructor checks agl's settings before verl builds anything: a bad
    combination (an async batch not larger than `data.train_batch_size`, KL in the reward, a
    critic or GAE, a verl feature agl's loop does not implement, a drain bound that is not
    positive) raises ValueError naming the key. `rollout` (`cpu_workers.ExternalRollout`): vLLM
    servers started elsewhere instead of the replicas verl starts (`init_workers`).
    """

    def __init__(self, config: Any, *args: Any, rollout: Any = None, **kwargs: Any) -> None:
        # agl's settings are checked before verl builds anything, so a bad one fails fast.
        self.agl_settings, self.runner_settings = trainer_settings(config)
        check_worker_config(config)
        check_rollout_correction(config.algorithm)
        self.external_rollout = rollout
        self.drain_timeout_s = drain_timeout_s(config)
        self.update_hold_s = update_hold_s(config)
        self.update_in_flight = update_in_flight(config)
        with warnings.catch_warnings():
            # verl 0.9 marks RayPPOTrainer deprecated in favour of its v1 trainer; agl keeps the
            # v0 worker stack (RayPPOTrainer's worker groups) and owns the loop, so the warning is noise here.
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*RayPPOTrainer.*")
            super().__init__(config, *args, **kwargs)
        self._proxy: ProxyControl | None = None
        self._loop = LoopThread("agl-trainer-loop")
        self._store: LightningStore | None = None
        self._dispatcher: RolloutDispatcher | None = None
        self._tracker: GroupTracker | None = None
        self._pending: list[Any] = []  # prompts drawn from the dataloader, not yet submitted
        # A checkpoint's groups in flight (None: not a resume), taken over by fit() (`ownership.take_over`).
        self._resumed_in_flight: list[dict[str, Any]] | None = None
        self._resumed_run_id: str | None = None
        self.identity = RunIdentity.new()
        self._take_over_metrics: dict[str, float] = {}
        self._published: dict[str, str] = {}  # the resource set of the weight version served (one per step)
        # The weight version the replicas serve: step s's rollouts run on version s, the weights after s − 1 updates.
        self._served_version = 1
        self._rng = random.Random(self.config.data.get("seed", 0) or 0)
        self._hooks: Any = None

    @property
    def proxy(self) -> ProxyControl:
        """The proxy's remote control, built on first use from `agl_base_url`, `agl_key`, 300 s timeout."""
        if self._proxy is None:
            self._proxy = ProxyControl(self.runner_settings.agl_base_url, self.runner_settings.agl_key)
        return self._proxy

    # --- agl's side, on the background loop -----------------------------------------------

    async def _open_agl(self) -> None:
        from agl_store.client import LightningStoreClient

        settings = self.runner_settings
        # Token ids stay int32 arrays on the read path: no Python int per id (docs/trainer.md, Speed).
        store = LightningStoreClient(
            settings.agl_base_url, key=settings.agl_key or None, timeout=300.0, token_arrays=True
        )
        await store.open()
        self._store = store
        # The store's own timeout is a backstop for runners that vanish: later than the
        # runner's kill, so the runner's verdict (and message) normally wins.
        config = RolloutConfig(timeout_seconds=settings.rollout_timeout_seconds + 2 * WAIT_GRACE_S)
        self._tracker = GroupTracker(
            store, self.agl_settings.rollout_n, rollout_config=config, metadata=self.identity.tags
        )
        if self._resumed_in_flight is not None:
            # Before the dispatcher starts: what the killed launch left is adopted or cancelled first.
            taken = await take_over(
                store, self._tracker, self.identity, self._resumed_in_flight, orphaned_worker_id=WORKER_ID
            )
            self._take_over_metrics = taken.metrics
            logger.info(
                "resumed run %s: %d groups in flight taken back (%d rollouts whose runner died requeued), "
                "%d other unfinished rollouts of the killed launch cancelled",
                self.identity.run_id,
                taken.adopted,
                taken.requeued,
                taken.cancelled,
            )
            self._resumed_in_flight = None
        runner = make_runner(settings)
        if runner is not None:
            self._dispatcher = RolloutDispatcher.for_settings(
                store, runner, self.runner_settings, store_url=self.proxy.base_url, claim_metadata=self.identity.claims
            )
            await self._dispatcher.start()

    async def _close_agl(self) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.stop()
        if self._store is not None:
            await self._store.close()
        if self._proxy is not None:
            await self._proxy.aclose()

    async def _publish_replicas(self) -> str:
        """The replicas and the sampling to the proxy, the resource set to the store. Both go to
        the proxy at every publish: a proxy restarted meanwhile has forgotten them."""
        assert self._store is not None
        await self.proxy.set_sampling(self.proxy_sampling_by_mode())
        return await publish_replicas(
            self._store,
            self.proxy,
            [replica.server_address for replica in self.llm_server_manager.get_replicas()],
            version=str(self._served_version),
            api_key=self.runner_settings.agent_key or None,
            sampling_parameters=self.sampling_by_mode()["train"],
            published=self._published,
            continue_generations=self.update_in_flight == "continue",
        )

    def sampling_by_mode(self) -> dict[str, dict[str, Any]]:
        """The sampling parameters the actor assumes, by rollout mode: training calls run with
        `actor_rollout_ref.rollout.temperature` / `top_p` / `top_k`, validation calls with
        `rollout.val_kwargs` (greedy unless `do_sample`); both are capped at
        `rollout.response_length` tokens."""
        rollout = self.config.actor_rollout_ref.rollout
        val = rollout.val_kwargs
        max_tokens = int(rollout.response_length)
        return {
            "train": {
                "temperature": float(rollout.temperature),
                "top_p": float(rollout.top_p),
                "top_k": int(rollout.top_k),
                "max_tokens": max_tokens,
            },
            "val": {
                "temperature": float(val.temperature) if val.get("do_sample", False) else 0.0,
                "top_p": float(val.top_p),
                "top_k": int(val.top_k),
                "max_tokens": max_tokens,
            },
        }

    def proxy_sampling_by_mode(self) -> dict[str, dict[str, Any]]:
        """What the proxy enforces: `sampling_by_mode`, and in a trajectory-level run the row budget
        of training calls (`row_tokens` = `trajectory_max_response_length`, what the aggregator keeps
        of a row's response part): a call may generate what its row still holds, so no row is
        truncated, while `rollout.response_length` still caps each call. Validation rows are not
        trained: their calls keep the per-call cap only."""
        by_mode = self.sampling_by_mode()
        settings = self.agl_settings
        if settings.level == LEVEL_TRAJECTORY:
            by_mode["train"][ROW_TOKENS] = settings.limits.max_response_length
        return by_mode

    async def _rollouts(self, new_inputs: Sequence[Any]) -> StepData:
        assert self._store is not None and self._tracker is not None
        resources_id = await self._publish_replicas()
        await self.proxy.resume()
        if self._dispatcher is not None:
            self._dispatcher.wake()
        settings = self.agl_settings
        pad_token_id = self.tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = self.tokenizer.eos_token_id
        return await rollout_step(
            self._store,
            self._tracker,
            new_inputs,
            settings,
            rollout_timeout_s=self.runner_settings.step_wait_seconds,
            pad_token_id=pad_token_id,
            rng=self._rng,
            adv_estimator=self.config.algorithm.adv_estimator,
            groups_to_train=settings.train_batch_size if settings.async_rollout else None,
            resources_id=resources_id,
            proxy=self.proxy,
            tokenizer=self.tokenizer,
            norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
            config=self.config.algorithm,
            sampling=self.sampling_by_mode()["train"],
            trained_version=self._served_version,
        )

    def _inputs_to_submit(self, plan: StepPlan) -> list[Any]:
        """Take from the pending prompts enough to have `plan.in_flight` groups in flight."""
        in_flight = len(self._tracker.in_flight) if self._tracker is not None else 0
        room = max(plan.in_flight - in_flight, 0)
        taken, self._pending = self._pending[:room], self._pending[room:]
        return taken

    async def _cancel_leftovers(self) -> dict[str, float]:
        """At the end of the run: cancel the groups still in flight and report them with the
        prompts never submitted (the run ended before the data: `trainer.total_training_steps`)."""
        assert self._tracker is not None
        groups, prompts = len(self._tracker.in_flight), len(self._pending)
        if groups or prompts:
            await self._tracker.abandon()
            logger.warning(
                "step %d is the last: %d groups in flight cancelled and %d drawn prompts not submitted "
                "(trainer.total_training_steps=%d ends the run before the data)",
                self.global_steps,
                groups,
                prompts,
                self.total_training_steps,
            )
            self._pending = []
        return {"rollout/n_groups_cancelled_at_end": float(groups), "rollout/n_prompts_not_trained": float(prompts)}

    # --- verl's side ------------------------------------------------------------------------

    def init_workers(self) -> None:
        """verl's worker groups and rollout replicas, without the managers agl does not use
        (`workers.init_worker_groups`)."""
        init_worker_groups(self)

    def _validate(self, merged: bool = False) -> dict[str, float]:
        """`rollout.val_kwargs.n` rollouts per validation task (mode `val`: the proxy runs them
        with `val_kwargs`' sampling), scored as verl does (`val-core/<data_source>/reward/mean@n`,
        ...; a task's `data_source` field, else `unknown`), plus `val/reward_mean`, `val/n_done`,
        `val/n_failed`."""
        tasks = [item[INPUT_KEY] for item in self.val_dataset]
        store = self._store
        assert store is not None
        tracker = GroupTracker(
            store,
            int(self.config.actor_rollout_ref.rollout.val_kwargs.get("n", 1)),
            mode="val",
            metadata=self.identity.tags,
        )

        async def run() -> dict[str, float]:
            resources_id = await self._publish_replicas()
            await self.proxy.resume()
            await tracker.submit(tasks, resources_id=resources_id)
            collected = await tracker.collect(
                len(tasks), self.runner_settings.wait_seconds(len(tasks) * tracker.n) + WAIT_GRACE_S
            )
            await tracker.abandon()
            exported = await self.proxy.wait_spans_exported()
            # Validation reads rewards only, which the runner records itself: a late call span changes nothing.
            traces = await read_succeeded(store, collected.groups, self.agl_settings.reward_fillna_value)
            rewards = [trace.reward for trace in traces]
            sources = {group.uid: _data_source(group.input) for group in collected.groups}
            metrics: dict[str, float] = {
                "val/reward_mean": float(np.mean(rewards)) if rewards else 0.0,
                "val/n_done": float(collected.counts.get("succeeded", 0)),
                "val/n_failed": float(collected.counts.get("failed", 0) + collected.counts.get("timeout", 0)),
                "val/spans_exported": float(exported),
            }
            if traces:
                metrics.update(
                    self._val_metrics_update(
                        np.array([sources[trace.uid] for trace in traces], dtype=object),
                        [trace.uid for trace in traces],
                        {"reward": rewards},
                        [],
                    )
                )
            return metrics

        return self._loop.run(run())

    def _schedule(self) -> StepSchedule:
        return schedule_for(self.config, len(self.train_dataloader), int(self.total_training_steps))

    def _batches(self, start_epoch: int) -> Iterator[list[Any]]:
        """The prompts of each dataloader batch from `start_epoch` on (a resumed loader starts
        inside that epoch, past the batches already drawn)."""
        for _ in range(start_epoch, int(self.config.trainer.total_epochs)):
            for batch_dict in self.train_dataloader:
                yield list(batch_dict[INPUT_KEY])

    def _save_checkpoint(self) -> None:
        """verl's checkpoint (actor, dataloader), with what was drawn but not trained first: the
        groups in flight (their rollout ids, so a resume reads or awaits them rather than
        enqueuing their prompts again) and the prompts not yet submitted."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        in_flight = [group.to_json() for group in self._tracker.in_flight] if self._tracker is not None else []
        carried = {
            "in_flight": in_flight,
            "pending": self._pending,
            "run_id": self.identity.run_id,
            "schedule": self._schedule().resume_key(),
        }
        with open(os.path.join(folder, CARRIED_FILE), "w", encoding="utf-8") as handle:
            json.dump(carried, handle)
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        """verl's resume, then agl's: the groups in flight come back (fit() takes them back
        in flight once the store is open), the prompts not yet submitted come back as pending,
        and the dataloader resumes where the schedule says (verl positions it by steps, which
        async rollout runs behind the batches drawn)."""
        fresh = self.train_dataloader.state_dict()
        super()._load_checkpoint()
        completed = self.global_steps
        if completed == 0:
            return
        trainer = self.config.trainer
        folder = os.path.abspath(
            trainer.resume_from_path
            if trainer.resume_mode == "resume_path"
            else os.path.join(trainer.default_local_dir, f"global_step_{completed}")
        )
        carried_path = os.path.join(folder, CARRIED_FILE)
        self._resumed_in_flight = []
        if os.path.exists(carried_path):
            with open(carried_path, encoding="utf-8") as handle:
                carried = json.load(handle)
            # A changed schedule would shift which batches each step draws: refused, before anything moves.
            self._schedule().check_resume(carried.get("schedule", {}))
            self._resumed_in_flight = list(carried["in_flight"])
            self._pending = list(carried["pending"])
            if carried.get("run_id"):
                self.identity = RunIdentity.resume(str(carried["run_id"]))
        _, offset = self._schedule().resume_position(completed)
        verl_restored = completed % len(self.train_dataloader) != 0
        if offset == 0 and verl_restored:
            self.train_dataloader.load_state_dict(fresh)
        elif offset != 0 and not verl_restored:
            import torch

            self.train_dataloader.load_state_dict(torch.load(os.path.join(folder, "data.pt"), weights_only=False))
        logger.info(
            "resumed after step %d with %d groups in flight and %d prompts to submit",
            completed,
            len(self._resumed_in_flight or []),
            len(self._pending),
        )

    def fit(self) -> None:
        """verl's training loop with agl's rollout step, on `StepSchedule`'s steps."""
        from omegaconf import OmegaConf

        # A fresh dump executor, as verl's fit has (a previous fit shut its own down); shutting
        # down first is idempotent and avoids reading the executor's private `_shutdown` flag.
        self._shutdown_dump_executor()
        self._init_dump_executor()
        tracking = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        self._served_version = self.global_steps + 1
        schedule = self._schedule()
        completed = self.global_steps
        self._hooks = run_startup_hooks(self.runner_settings.hooks)
        self._loop.start()
        try:
            self._loop.run(self._open_agl())
            if self.config.trainer.get("val_before_train", True):
                tracking.log(data=self._validate(), step=self.global_steps)
                if self.config.trainer.get("val_only", False):
                    return
            batches = self._batches(schedule.resume_position(completed)[0])
            for step in range(completed + 1, schedule.last_step + 1):
                plan = schedule.plan(step)
                self.global_steps = step
                for _ in range(plan.draw):
                    self._pending += next(batches, [])
                new_inputs = self._inputs_to_submit(plan)
                if not new_inputs and self._tracker is not None and not self._tracker.in_flight:
                    logger.warning("step %d: the dataloader ended before step %d; stopping", step, schedule.last_step)
                    break
                metrics = self._train_step(new_inputs, save=plan.save)
                metrics.update({"training/global_step": step, "training/epoch": plan.epoch})
                metrics.update(self._take_over_metrics)  # the first step after a resume says what it took back
                self._take_over_metrics = {}
                if plan.validate:
                    metrics.update(self._validate())
                if plan.is_last:
                    metrics.update(self._loop.run(self._cancel_leftovers()))
                tracking.log(data=metrics, step=step)
        finally:
            self._shutdown_dump_executor()
            self._loop.run(self._close_agl())
            self._loop.stop()

    def _prepare_batch(self, batch: DataProto, metrics: dict[str, float]) -> None:
        """What verl does to a batch before its log-probs: `trainer.balance_batch` (reorder the
        rows so each data-parallel rank gets similar token counts), token counts, temperature."""
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature

    def _dump_rollouts(self, batch: DataProto, timing_raw: dict[str, float]) -> None:
        """`trainer.rollout_data_dir`: the step's rows as verl writes them (`<dir>/<step>.jsonl`:
        decoded prompt and response, score), with each row's rollout id and uid."""
        directory = self.config.trainer.get("rollout_data_dir")
        if directory:
            extra = {key: batch.non_tensor_batch[key].tolist() for key in ("rollout_id", "uid")}
            self._log_rollout_data(batch, extra, timing_raw, directory)

    def _train_step(self, new_inputs: Sequence[Any], save: bool = False) -> dict[str, float]:
        metrics: dict[str, float] = {}
        timing_raw: dict[str, float] = {}
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw):
                step = self._loop.run(self._rollouts(new_inputs))
                metrics.update(step.metrics)
                paused = self._loop.run(
                    pause_for_update(self.proxy, self.drain_timeout_s, self.update_hold_s, self.update_in_flight)
                )
                metrics.update(paused)
                aborted = paused["rollout/proxy_calls_cancelled_at_update"] > 0
                if aborted:
                    # The proxy answered the calls it cut, but the engine may still be generating
                    # them: stop it before it sleeps, as verl's own loop does.
                    self.checkpoint_manager.abort_replicas()
                self.checkpoint_manager.sleep_replicas()
            batch = step.data
            if batch is not None:
                self._prepare_batch(batch, metrics)
                with marked_timer("old_log_prob", timing_raw):
                    old_log_prob, _ = self._compute_old_log_prob(batch)
                    entropys = old_log_prob.batch.pop("entropys", None)
                    if entropys is not None:
                        metrics["actor/entropy"] = self._entropy(entropys, batch)
                    batch = batch.union(old_log_prob)
                    if "rollout_log_probs" in batch.batch:
                        # vLLM's logprobs against the actor's: near 0 only when the rollouts ran on its weights.
                        metrics.update(calculate_debug_metrics(batch))
                    # verl's algorithm.rollout_correction, as verl's loop applies it: after the old log-probs.
                    batch, correction = apply_rollout_correction(batch, self.config.algorithm)
                    metrics.update(correction)
                if self.use_reference_policy:
                    with marked_timer("ref", timing_raw):
                        batch = batch.union(self._compute_ref_log_prob(batch))
                run_batch_hook(self._hooks, self.global_steps, batch)
                with marked_timer("update_actor", timing_raw):
                    actor_output = self._update_actor(batch)
                metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
            else:
                logger.warning(
                    "step %d: no trainable rows (all rollouts failed or too few rows); no update", self.global_steps
                )
            if save:
                # As verl: saved while the replicas sleep, before update_weights wakes them.
                with marked_timer("save_checkpoint", timing_raw):
                    self._save_checkpoint()
                    self._loop.run(
                        after_checkpoint(self._store, self.config.agentlightning, self._tracker, self.identity.run_id)
                    )
            with marked_timer("update_weights", timing_raw):
                self.checkpoint_manager.update_weights(self.global_steps)
                if aborted:
                    self.checkpoint_manager.resume_generation_replicas()  # an abort leaves the engine paused
            self._served_version = self.global_steps + 1
            # Calls held during the update run on the new weights: the proxy must tag them so before it lets them go.
            self._loop.run(self._publish_replicas())
            self._loop.run(self.proxy.resume())
            if batch is not None:
                self._dump_rollouts(batch, timing_raw)
        metrics["timing_s/agl_step"] = timing_raw["step"]
        if batch is not None:
            data_metrics = compute_data_metrics(batch=batch, use_critic=False)
            # The batch's advantages are agl's per-rollout normalised ones (training/advantages_normalized/*
            # when normalised); verl's names keep the estimator's advantages, which the step measured.
            metrics.update({k: v for k, v in data_metrics.items() if not k.startswith("critic/advantages/")})
            metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
            n_gpus = self.resource_pool_manager.get_n_gpus()
            metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus))
        return metrics

    def _entropy(self, entropys: Any, batch: DataProto) -> float:
        """`actor/entropy` as verl's loop computes it: the old policy's token entropies, aggregated
        like the loss (`actor.loss_agg_mode`)."""
        actor = self.config.actor_rollout_ref.actor
        return float(
            agg_loss(
                loss_mat=entropys,
                loss_mask=batch.batch["response_mask"],
                loss_agg_mode=actor.loss_agg_mode,
                loss_scale_factor=actor.get("loss_scale_factor", None),
            )
            .detach()
            .item()
        )


def _data_source(task: Any) -> str:
    """A task's `data_source` (verl's per-source validation metrics), else `unknown` as in verl."""
    return str(task.get("data_source", "unknown")) if isinstance(task, dict) else "unknown"


__all__: list[str] = ["AglTrainer", "CARRIED_FILE", "drain_timeout_s", "update_hold_s", "update_in_flight"]
