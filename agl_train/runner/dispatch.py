"""The dispatcher: claims queued rollouts from the store and runs each one with a runner.

Rollouts go through the store's queue, so runners on other machines (`agl` runners of the
agent-lightning kind, or a second trainer-side dispatcher) can share the work. Each claimed
rollout is run by `Runner.run` with the endpoints of the LLM resource it was enqueued with,
and its outcome is recorded (`record_outcome`); a runner that raises fails that rollout only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from agl_store.base import LightningStore
from agl_store.models import LLM, AttemptedRollout

from .env import RolloutEndpoints
from .outcome import RolloutOutcome, record_outcome
from .runner_settings import RunnerSettings

logger = logging.getLogger(__name__)

POLL_S = 0.2
"""How often an idle dispatcher looks at the queue."""
WORKER_ID = "agl-trainer"


class Runner(Protocol):
    """Runs one attempt of a rollout to its end and says how it ended (never raises for the agent)."""

    async def run(self, rollout: AttemptedRollout, endpoints: RolloutEndpoints) -> RolloutOutcome: ...


class RolloutDispatcher:
    """Runs queued rollouts with `runner`, at most `max_concurrency` at a time.

    ```python
    dispatcher = RolloutDispatcher(store, runner, store_url="http://localhost:8080")
    await dispatcher.start()
    ...  # enqueue rollouts; they run in the background
    await dispatcher.stop()
    ```
    `llm_resource` names the LLM in a rollout's resources that the agent calls (the first
    LLM resource when None). With `claim_metadata` it claims only the rollouts whose metadata
    holds those key/values (the trainer's: its launch's, `ownership.RunIdentity.claims`). The
    trainer builds it with `for_settings`, whose concurrency is `agentlightning.max_concurrency`
    (default: every rollout of a step at once).
    """

    def __init__(
        self,
        store: LightningStore,
        runner: Runner,
        *,
        max_concurrency: int = 64,
        store_url: str | None = None,
        llm_resource: str | None = None,
        worker_id: str = WORKER_ID,
        claim_metadata: Mapping[str, str] | None = None,
    ) -> None:
        if max_concurrency <= 0:
            raise ValueError(f"max_concurrency must be positive, got {max_concurrency}")
        self.store = store
        self.runner = runner
        self.max_concurrency = max_concurrency
        self.store_url = store_url
        self.llm_resource = llm_resource
        self.worker_id = worker_id
        self.claim_metadata = dict(claim_metadata) if claim_metadata is not None else None
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._llms: dict[str | None, LLM] = {}

    @classmethod
    def for_settings(
        cls,
        store: LightningStore,
        runner: Runner,
        settings: RunnerSettings,
        *,
        store_url: str | None = None,
        claim_metadata: Mapping[str, str] | None = None,
    ) -> RolloutDispatcher:
        """The trainer's dispatcher: `settings.rollout_concurrency` rollouts at a time."""
        return cls(
            store,
            runner,
            max_concurrency=settings.rollout_concurrency,
            store_url=store_url,
            claim_metadata=claim_metadata,
        )

    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    async def start(self) -> None:
        if self.is_running():
            raise RuntimeError("the dispatcher is already running")
        self._loop_task = asyncio.create_task(self._loop(), name="agl-rollout-dispatcher")

    def wake(self) -> None:
        """Look at the queue now (call after enqueueing) instead of at the next poll."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming and cancel the rollouts still running (their processes are killed)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()

    async def _loop(self) -> None:
        while True:
            free = self.max_concurrency - len(self._running)
            claimed = []
            if free > 0:
                try:
                    claimed = list(
                        await self.store.dequeue_many_rollouts(
                            limit=free, worker_id=self.worker_id, metadata=self.claim_metadata
                        )
                    )
                except Exception:  # a flaky store must not end the loop
                    logger.exception("rollout dispatcher: dequeue failed; retrying")
            for rollout in claimed:
                task = asyncio.create_task(self._run_one(rollout), name=f"agl-rollout-{rollout.rollout_id}")
                self._running.add(task)
                task.add_done_callback(self._finished)
            if not claimed:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                except TimeoutError:
                    pass

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._wake.set()

    async def _run_one(self, rollout: AttemptedRollout) -> None:
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        try:
            endpoints = await self.endpoints(rollout)
            outcome = await self.runner.run(rollout, endpoints)
        except asyncio.CancelledError:
            await record_outcome(self.store, RolloutOutcome(rollout_id, attempt_id, "failed", message="cancelled"))
            raise
        except Exception as exc:  # one rollout's failure must not stop the others
            logger.exception("rollout %s failed in its runner", rollout_id)
            outcome = RolloutOutcome(rollout_id, attempt_id, "failed", message=f"{type(exc).__name__}: {exc}")
        await record_outcome(self.store, outcome)

    async def endpoints(self, rollout: AttemptedRollout) -> RolloutEndpoints:
        """The per-rollout base URL, model and key of the LLM resource the rollout was enqueued with."""
        llm = self._llms.get(rollout.resources_id)
        if llm is None:
            update = (
                await self.store.get_resources_by_id(rollout.resources_id)
                if rollout.resources_id
                else await self.store.get_latest_resources()
            )
            if update is None:
                raise LookupError(f"rollout {rollout.rollout_id} has no resources: publish an LLM resource first")
            llms = {name: r for name, r in update.resources.items() if isinstance(r, LLM)}
            if not llms:
                raise LookupError(f"resources {update.resources_id!r} hold no LLM resource")
            if self.llm_resource is not None and self.llm_resource not in llms:
                raise LookupError(f"resources {update.resources_id!r} have no LLM named {self.llm_resource!r}")
            llm = llms[self.llm_resource] if self.llm_resource is not None else next(iter(llms.values()))
            if rollout.resources_id:
                # A resources id names one snapshot only while nobody updates it; the trainer
                # publishes a new id per weight version, so caching by id is safe.
                self._llms[rollout.resources_id] = llm
        return RolloutEndpoints(
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            model=llm.model,
            key=llm.api_key or "",
            store_url=self.store_url,
        )
