"""The LightningStore contract (agl_store/base.py), run against every backend.

Each test reads as an example of using the store. Tests never assume the store is empty
beyond what they created, and outcomes of the store's own clock (timeouts, unresponsive
attempts) are awaited, never timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from agl_store import (
    LLM,
    AttemptedRollout,
    ConflictError,
    EnqueueRolloutRequest,
    InvalidInputError,
    NotFoundError,
    PromptTemplate,
    ProxyLLM,
    RolloutConfig,
    Span,
    StoreClosedError,
    reward_span,
)
from agl_store.base import LightningStore
from agl_store.bounds import MAX_INTEGER, MAX_JSON_DEPTH
from agl_store.models import Event

T = TypeVar("T")
PATIENCE_S = 30.0  # only bounds a broken test; a passing one returns as soon as the store acts


async def eventually(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """Re-read until `done(value)`; fails the test if the store never gets there."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        value = await read()
        if done(value) or time.monotonic() > deadline:
            assert done(value), f"store never reached the expected state; last value: {value!r}"
            return value
        await asyncio.sleep(0.05)


async def running_rollout(store: LightningStore, **config: Any) -> AttemptedRollout:
    """A rollout dequeued by a worker and reporting its first span: the usual runner path."""
    await store.enqueue_rollout(input={"task": "t"}, config=RolloutConfig(**config) if config else None)
    rollout = await store.dequeue_rollout(worker_id="worker-1")
    assert rollout is not None
    await store.add_span(Span(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, name="step"))
    return rollout


def llm_span(rollout_id: str, attempt_id: str, *, sequence_id: int | None = None, **fields: Any) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        name=fields.pop("name", "agl.llm_call"),
        attributes=fields.pop("attributes", {"agl.prompt_token_ids": list(range(100, 140))}),
        **fields,
    )


# --- rollouts and the queue ---------------------------------------------------------------


async def test_enqueued_rollout_waits_in_queue_without_attempt(store: LightningStore) -> None:
    config = RolloutConfig(timeout_seconds=60, max_attempts=3, retry_condition=["failed"])
    queued = await store.enqueue_rollout(input={"q": "2+2"}, mode="train", config=config, metadata={"k": 1})

    assert queued.status == "queuing" and queued.mode == "train" and queued.metadata == {"k": 1}
    fetched = await store.get_rollout_by_id(queued.rollout_id)
    assert fetched is not None and not isinstance(fetched, AttemptedRollout)
    assert fetched.input == {"q": "2+2"} and fetched.config == config
    assert await store.get_latest_attempt(queued.rollout_id) is None
    assert await store.get_rollout_by_id("ro-missing") is None
    with pytest.raises(NotFoundError):
        await store.get_latest_attempt("ro-missing")


async def test_dequeue_is_fifo_and_creates_preparing_attempts(store: LightningStore) -> None:
    first = await store.enqueue_rollout(input=1)
    rest = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=2), EnqueueRolloutRequest(input=3)])

    claimed = [await store.dequeue_rollout() for _ in range(3)]

    assert [r.rollout_id for r in claimed] == [first.rollout_id] + [r.rollout_id for r in rest]
    for rollout in claimed:
        assert rollout.status == "preparing"
        assert rollout.attempt.status == "preparing" and rollout.attempt.sequence_id == 1
    assert await store.dequeue_rollout() is None


async def test_dequeue_many_claims_oldest_first(store: LightningStore) -> None:
    ids = [r.rollout_id for r in await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(5)])]

    assert await store.dequeue_many_rollouts(limit=0) == []
    batch = await store.dequeue_many_rollouts(limit=3, worker_id="w")
    tail = await store.dequeue_many_rollouts(limit=10)

    assert [r.rollout_id for r in batch] == ids[:3]
    assert [r.rollout_id for r in tail] == ids[3:]


async def test_dequeue_with_metadata_claims_only_the_rollouts_that_match(store: LightningStore) -> None:
    # Two runs share one store: each dispatcher claims its own run's rollouts only, oldest first.
    mine, theirs = {"agl.run": "run-a"}, {"agl.run": "run-b"}
    queued = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=i, metadata=theirs if i < 3 else {**mine, "n": i}) for i in range(6)]
    )
    await store.enqueue_rollout(input="no metadata")

    first = await store.dequeue_rollout(worker_id="w", metadata=mine)
    rest = await store.dequeue_many_rollouts(limit=10, worker_id="w", metadata=mine)

    assert [r.rollout_id for r in [first, *rest]] == [r.rollout_id for r in queued[3:]]
    assert await store.dequeue_many_rollouts(limit=10, metadata=mine) == []
    assert await store.dequeue_rollout(metadata={"agl.run": "run-c"}) is None
    others = await store.dequeue_many_rollouts(limit=10)  # no filter: any rollout, as before
    assert [r.input for r in others] == [0, 1, 2, "no metadata"]
    for bad in ({"agl.run": 1}, {'a"b': "x"}, ["agl.run"]):
        with pytest.raises(InvalidInputError, match="metadata"):
            await store.dequeue_many_rollouts(limit=1, metadata=bad)  # type: ignore[arg-type]


async def test_enqueued_rollouts_take_the_latest_resources_unless_given(store: LightningStore) -> None:
    assert (await store.enqueue_rollout(input="before any resources")).resources_id is None
    older = await store.add_resources({"main_llm": LLM(endpoint="http://old/v1", model="m")})
    latest = await store.add_resources({"main_llm": LLM(endpoint="http://new/v1", model="m")})

    one = await store.enqueue_rollout(input=1)
    many = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=2), EnqueueRolloutRequest(input=3, resources_id=older.resources_id)]
    )

    assert [r.resources_id for r in (one, *many)] == [latest.resources_id, latest.resources_id, older.resources_id]
    assert (await store.get_rollout_by_id(one.rollout_id)).resources_id == latest.resources_id
    assert (await store.dequeue_rollout()).resources_id is None  # resolved when enqueued, not when claimed


async def test_start_rollout_bypasses_queue_with_latest_resources(store: LightningStore) -> None:
    resources = await store.add_resources({"main_llm": LLM(endpoint="http://llm/v1", model="m")})

    started = await store.start_rollout(input={"x": 1}, mode="val", worker_id="w1")

    assert started.status == "preparing" and started.resources_id == resources.resources_id
    assert started.attempt.sequence_id == 1 and started.attempt.worker_id == "w1"
    assert await store.dequeue_rollout() is None
    assert (await store.get_latest_attempt(started.rollout_id)) == started.attempt


async def test_a_create_repeated_with_its_idempotency_key_returns_the_first_rollout(store: LightningStore) -> None:
    started = await store.start_rollout(input={"q": 1}, worker_id="w1", idempotency_key="start-1")
    again = await store.start_rollout(input={"q": 1}, worker_id="w1", idempotency_key="start-1")
    assert (again.rollout_id, again.attempt.attempt_id) == (started.rollout_id, started.attempt.attempt_id)

    queued = await store.enqueue_rollout(input={"q": 2}, idempotency_key="enqueue-1")
    assert (await store.enqueue_rollout(input={"q": 2}, idempotency_key="enqueue-1")).rollout_id == queued.rollout_id
    batch = [EnqueueRolloutRequest(input=i, idempotency_key=f"batch-{i}") for i in range(3)]
    first = await store.enqueue_many_rollouts(batch)
    retried = await store.enqueue_many_rollouts([batch[1], EnqueueRolloutRequest(input=9), batch[2]])
    assert [r.rollout_id for r in retried[::2]] == [first[1].rollout_id, first[2].rollout_id]
    assert retried[1].rollout_id not in {r.rollout_id for r in first}

    claimed = await store.dequeue_many_rollouts(limit=10)  # each rollout was queued once
    assert [r.rollout_id for r in claimed] == [queued.rollout_id, *(r.rollout_id for r in first), retried[1].rollout_id]
    assert (await store.enqueue_rollout(input={"q": 2}, idempotency_key="enqueue-1")).status == "preparing"

    unstarted = await store.enqueue_rollout(input={"q": 3}, idempotency_key="enqueue-2")
    with pytest.raises(ConflictError, match=unstarted.rollout_id):
        await store.start_rollout(input={"q": 3}, idempotency_key="enqueue-2")
    with pytest.raises(InvalidInputError, match="idempotency_key"):
        await store.start_rollout(input={"q": 4}, idempotency_key="k" * 201)


async def test_first_span_moves_attempt_and_rollout_to_running(store: LightningStore) -> None:
    await store.enqueue_rollout(input=None)
    rollout = await store.dequeue_rollout()
    assert rollout is not None

    await store.add_span(llm_span(rollout.rollout_id, rollout.attempt.attempt_id))

    fetched = await store.get_rollout_by_id(rollout.rollout_id)
    assert isinstance(fetched, AttemptedRollout)
    assert fetched.status == "running" and fetched.attempt.status == "running"
    assert fetched.attempt.last_heartbeat_time is not None


async def test_succeeded_attempt_finishes_rollout(store: LightningStore) -> None:
    rollout = await running_rollout(store)

    attempt = await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

    assert attempt.status == "succeeded" and attempt.end_time is not None
    finished = await store.get_rollout_by_id(rollout.rollout_id)
    assert finished is not None and finished.status == "succeeded" and finished.end_time is not None


async def test_failed_attempt_requeues_until_max_attempts(store: LightningStore) -> None:
    rollout = await running_rollout(store, max_attempts=2, retry_condition=["failed"])
    other = await store.enqueue_rollout(input="queued meanwhile")

    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="failed")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "requeuing"

    # A requeued rollout goes to the tail of the queue, behind rollouts queued before.
    assert (await store.dequeue_rollout()).rollout_id == other.rollout_id
    retry = await store.dequeue_rollout()
    assert retry is not None and retry.rollout_id == rollout.rollout_id
    assert retry.attempt.sequence_id == 2 and retry.attempt.attempt_id != rollout.attempt.attempt_id

    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "failed"
    assert [a.sequence_id for a in await store.query_attempts(rollout.rollout_id)] == [1, 2]


async def test_failure_not_listed_in_retry_condition_fails_rollout(store: LightningStore) -> None:
    rollout = await running_rollout(store, max_attempts=5, retry_condition=["timeout"])

    await store.update_attempt(rollout.rollout_id, "latest", status="failed")

    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "failed"
    assert await store.dequeue_rollout() is None


async def test_only_the_latest_attempt_decides_the_rollout(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    retry = await store.start_attempt(rollout.rollout_id, worker_id="w2")
    assert retry.attempt.sequence_id == 2 and retry.status == "preparing"

    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="failed")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "preparing"

    await store.update_attempt(rollout.rollout_id, retry.attempt.attempt_id, status="succeeded")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "succeeded"


async def test_start_attempt_runs_a_succeeded_rollout_again(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

    again = await store.start_attempt(rollout.rollout_id, worker_id="w2")

    assert again.status == "preparing" and again.end_time is None
    assert again.attempt.sequence_id == 2 and again.attempt.status == "preparing"
    await store.add_span(llm_span(rollout.rollout_id, again.attempt.attempt_id))
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "running"
    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "failed"  # it follows its latest attempt
    with pytest.raises(NotFoundError):
        await store.start_attempt("ro-missing")


async def test_an_algorithm_requeues_a_failed_rollout(store: LightningStore) -> None:
    rollout = await running_rollout(store)  # one attempt allowed, no retry condition
    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    assert (await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=0))[0].status == "failed"

    requeued = await store.update_rollout(
        rollout.rollout_id, status="requeuing", config=RolloutConfig(max_attempts=2, retry_condition=["failed"])
    )

    assert requeued.status == "requeuing" and requeued.end_time is None
    assert await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=0) == []
    retry = await store.dequeue_rollout(worker_id="w2")
    assert retry is not None and retry.rollout_id == rollout.rollout_id and retry.attempt.sequence_id == 2
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "succeeded"


async def test_a_finished_rollout_takes_any_change(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.update_rollout(rollout.rollout_id, status="cancelled")

    updated = await store.update_rollout(rollout.rollout_id, metadata={"note": "kept"}, input={"changed": True})
    assert updated.status == "cancelled" and updated.metadata == {"note": "kept"} and updated.input == {"changed": True}
    assert (await store.update_rollout(rollout.rollout_id, status="running")).status == "running"


async def test_a_late_attempt_report_leaves_a_cancelled_rollout_cancelled(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.update_rollout(rollout.rollout_id, status="cancelled")

    attempt = await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

    assert attempt.status == "succeeded"
    assert (await store.get_rollout_by_id(rollout.rollout_id)).status == "cancelled"


async def test_update_rollout_changes_fields_and_requeues_once(store: LightningStore) -> None:
    rollout = await running_rollout(store)

    updated = await store.update_rollout(
        rollout.rollout_id, status="requeuing", mode="test", resources_id="rs-x", config=RolloutConfig(max_attempts=4)
    )
    assert updated.status == "requeuing" and updated.mode == "test" and updated.resources_id == "rs-x"
    assert updated.config.max_attempts == 4
    await store.update_rollout(rollout.rollout_id, status="queuing")  # still queued: no second entry

    again = await store.dequeue_rollout()
    assert again is not None and again.rollout_id == rollout.rollout_id and again.attempt.sequence_id == 2
    assert await store.dequeue_rollout() is None


async def test_cancelling_a_queued_rollout_removes_it_from_the_queue(store: LightningStore) -> None:
    queued = await store.enqueue_rollout(input="x")

    cancelled = await store.update_rollout(queued.rollout_id, status="cancelled")

    assert cancelled.status == "cancelled" and cancelled.end_time is not None
    assert await store.dequeue_rollout() is None


async def test_illegal_attempt_moves_are_conflicts(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

    with pytest.raises(ConflictError):
        await store.update_attempt(rollout.rollout_id, "latest", status="running")
    with pytest.raises(NotFoundError):
        await store.update_attempt(rollout.rollout_id, "at-missing", status="failed")
    with pytest.raises(NotFoundError):
        await store.update_attempt("ro-missing", "latest", status="failed")
    with pytest.raises(InvalidInputError, match="status"):
        await store.update_attempt(rollout.rollout_id, "latest", status="exploded")


async def test_update_attempt_takes_no_nulls(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.update_attempt(rollout.rollout_id, "latest", metadata={"kept": True})

    for field in ("metadata", "worker_id", "status", "last_heartbeat_time"):
        with pytest.raises(InvalidInputError, match=field):
            await store.update_attempt(rollout.rollout_id, "latest", **{field: None})

    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt.metadata == {"kept": True} and attempt.worker_id == "worker-1"


async def test_update_attempt_records_worker_heartbeat_and_metadata(store: LightningStore) -> None:
    rollout = await running_rollout(store)

    attempt = await store.update_attempt(
        rollout.rollout_id, "latest", worker_id="w9", last_heartbeat_time=123.5, metadata={"gpu": 0}
    )

    assert attempt.worker_id == "w9" and attempt.last_heartbeat_time == 123.5 and attempt.metadata == {"gpu": 0}
    assert (await store.get_latest_attempt(rollout.rollout_id)) == attempt
    worker = await store.get_worker_by_id("w9")
    assert worker is not None and worker.status == "busy" and worker.current_rollout_id == rollout.rollout_id


async def test_query_rollouts_filters_sorts_and_pages(store: LightningStore) -> None:
    before = time.time()
    train = [await store.enqueue_rollout(input=i, mode="train") for i in range(4)]
    val = await store.enqueue_rollout(input="v", mode="val")
    done = await running_rollout(store)  # claims train[0]
    assert done.rollout_id == train[0].rollout_id
    await store.update_attempt(done.rollout_id, "latest", status="succeeded")
    mine = [r.rollout_id for r in train] + [val.rollout_id]

    page = await store.query_rollouts(rollout_id_in=mine, sort_by="rollout_id", limit=2, offset=1)
    assert [r.rollout_id for r in page] == sorted(mine)[1:3] and page.total == 5

    assert {r.rollout_id for r in await store.query_rollouts(rollout_id_in=mine, mode="val")} == {val.rollout_id}
    succeeded = await store.query_rollouts(rollout_id_in=mine, status_in=["succeeded"])
    assert [r.rollout_id for r in succeeded] == [done.rollout_id]
    assert isinstance(succeeded[0], AttemptedRollout) and succeeded[0].attempt.status == "succeeded"
    either = await store.query_rollouts(status_in=["succeeded"], mode="val", filter_logic="or")
    assert {done.rollout_id, val.rollout_id} <= {r.rollout_id for r in either}
    assert [r.rollout_id for r in await store.query_rollouts(rollout_id_contains=val.rollout_id[3:])] == [
        val.rollout_id
    ]
    recent = await store.query_rollouts(
        rollout_id_in=mine, start_time_after=before - 1, start_time_before=time.time() + 1
    )
    assert recent.total == 5
    newest_first = await store.query_rollouts(rollout_id_in=mine, sort_by="start_time", sort_order="desc")
    assert newest_first[0].rollout_id == val.rollout_id


async def test_query_attempts_sorts_and_pages(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    await store.start_attempt(rollout.rollout_id)
    await store.start_attempt(rollout.rollout_id)

    attempts = await store.query_attempts(rollout.rollout_id, sort_order="desc", limit=2)

    assert [a.sequence_id for a in attempts] == [3, 2] and attempts.total == 3


# --- the watchdog --------------------------------------------------------------------------


async def test_watchdog_times_out_an_attempt_and_fails_the_rollout(store: LightningStore) -> None:
    rollout = await running_rollout(store, timeout_seconds=0.2)

    finished = await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=PATIENCE_S)

    assert [r.status for r in finished] == ["failed"]
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "timeout" and attempt.end_time is not None
    worker = await store.get_worker_by_id("worker-1")
    assert worker is not None and worker.status == "unknown"


async def test_watchdog_requeues_an_unresponsive_attempt_when_allowed(store: LightningStore) -> None:
    rollout = await running_rollout(store, unresponsive_seconds=0.2, max_attempts=2, retry_condition=["unresponsive"])

    requeued = await eventually(lambda: store.get_rollout_by_id(rollout.rollout_id), lambda r: r.status == "requeuing")

    assert isinstance(requeued, AttemptedRollout) and requeued.attempt.status == "unresponsive"
    retry = await store.dequeue_rollout()
    assert retry is not None and retry.rollout_id == rollout.rollout_id and retry.attempt.sequence_id == 2


async def test_watchdog_marks_attempt_without_any_span_unresponsive(store: LightningStore) -> None:
    started = await store.start_rollout(input="silent", config=RolloutConfig(unresponsive_seconds=0.2))

    finished = await store.wait_for_rollouts(rollout_ids=[started.rollout_id], timeout=PATIENCE_S)

    assert [r.status for r in finished] == ["failed"]
    assert (await store.get_latest_attempt(started.rollout_id)).status == "unresponsive"


async def test_a_late_span_revives_an_unresponsive_attempt(store: LightningStore) -> None:
    rollout = await running_rollout(store, unresponsive_seconds=0.2, max_attempts=2, retry_condition=["unresponsive"])
    await eventually(lambda: store.get_rollout_by_id(rollout.rollout_id), lambda r: r.status == "requeuing")

    await store.add_span(llm_span(rollout.rollout_id, rollout.attempt.attempt_id))

    revived = await store.get_rollout_by_id(rollout.rollout_id)
    assert isinstance(revived, AttemptedRollout)
    assert revived.attempt.attempt_id == rollout.attempt.attempt_id
    assert revived.status in ("running", "requeuing", "failed")  # the watchdog may strike again at once
    if revived.status == "running":
        assert revived.attempt.status == "running"


# --- spans and sequence numbers ---------------------------------------------------------------


async def test_sequence_ids_increase_per_rollout(store: LightningStore) -> None:
    a = await running_rollout(store)  # its first span took sequence id 1
    b = await running_rollout(store)
    ids_a = [await store.get_next_span_sequence_id(a.rollout_id, a.attempt.attempt_id) for _ in range(3)]
    many = await store.get_many_span_sequence_ids(
        [
            (a.rollout_id, a.attempt.attempt_id),
            (b.rollout_id, b.attempt.attempt_id),
            (a.rollout_id, a.attempt.attempt_id),
        ]
    )

    assert ids_a == [2, 3, 4]
    assert many == [5, 2, 6]
    # Numbers are per rollout: the attempt may be "latest" or one the store has not seen.
    assert await store.get_next_span_sequence_id(a.rollout_id, "latest") == 7
    assert await store.get_next_span_sequence_id(a.rollout_id, "at-missing") == 8
    assert await store.get_many_span_sequence_ids([(b.rollout_id, "at-missing"), (b.rollout_id, "latest")]) == [3, 4]
    with pytest.raises(NotFoundError):
        await store.get_next_span_sequence_id("ro-missing", "latest")


async def test_spans_get_sequence_ids_and_come_back_in_order(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id

    stored = await store.add_many_spans([llm_span(rid, aid, name=f"call-{i}") for i in range(5)])

    assert [s.sequence_id for s in stored] == [2, 3, 4, 5, 6]
    spans = await store.query_spans(rid)
    assert [s.name for s in spans] == ["step"] + [f"call-{i}" for i in range(5)]
    assert spans.total == 6
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5, 6]


async def test_a_span_with_its_own_sequence_id_pushes_the_counter(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id

    kept = await store.add_span(llm_span(rid, aid, sequence_id=50))

    assert kept is not None and kept.sequence_id == 50
    assert await store.get_next_span_sequence_id(rid, aid) == 51
    assert (await store.add_span(llm_span(rid, aid))).sequence_id == 52


async def test_a_span_with_sequence_id_zero_is_kept_as_sent(store: LightningStore) -> None:
    rollout = await running_rollout(store)  # its first span took sequence id 1
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id

    zero = await store.add_span(llm_span(rid, aid, sequence_id=0, name="unordered"))

    assert zero is not None and zero.sequence_id == 0
    assert [(s.name, s.sequence_id) for s in await store.query_spans(rid)] == [("unordered", 0), ("step", 1)]
    assert await store.get_next_span_sequence_id(rid, aid) == 2
    with pytest.raises(InvalidInputError, match="sequence_id must be >= 0"):
        await store.add_span(llm_span(rid, aid, sequence_id=-1))


async def test_spans_sent_to_the_latest_attempt_are_stored_under_it(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rid = rollout.rollout_id
    retry = (await store.start_attempt(rid)).attempt.attempt_id

    one = await store.add_span(llm_span(rid, "latest", name="one"))
    many = await store.add_many_spans([llm_span(rid, "latest", name="two"), llm_span(rid, retry, name="three")])

    assert [(s.name, s.attempt_id) for s in (one, *many)] == [("one", retry), ("two", retry), ("three", retry)]
    assert [s.name for s in await store.query_spans(rid, retry)] == ["one", "two", "three"]
    assert (await store.get_latest_attempt(rid)).status == "running"  # the spans were its heartbeats
    queued = await store.enqueue_rollout(input="no attempt yet")
    with pytest.raises(NotFoundError, match="has no attempts"):
        await store.add_span(llm_span(queued.rollout_id, "latest"))


async def test_duplicate_spans_are_ignored(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    span = llm_span(rollout.rollout_id, rollout.attempt.attempt_id, span_id="0123456789abcdef")

    first = await store.add_span(span)
    again = await store.add_span(span)
    batch = await store.add_many_spans([span, llm_span(rollout.rollout_id, rollout.attempt.attempt_id, name="new")])

    assert first is not None and again is None
    assert [s.name for s in batch] == ["new"]
    assert len(await store.query_spans(rollout.rollout_id, span_id="0123456789abcdef")) == 1


async def test_spans_need_a_known_rollout_and_attempt(store: LightningStore) -> None:
    rollout = await running_rollout(store)

    with pytest.raises(NotFoundError):
        await store.add_span(llm_span("ro-missing", "at-missing"))
    with pytest.raises(NotFoundError):
        await store.add_span(llm_span(rollout.rollout_id, "at-missing"))
    with pytest.raises(NotFoundError):
        # One bad span rejects the whole batch: nothing half-written.
        await store.add_many_spans([llm_span(rollout.rollout_id, rollout.attempt.attempt_id), llm_span("ro-x", "at-x")])
    assert len(await store.query_spans(rollout.rollout_id)) == 1


async def test_concurrent_writes_succeed_or_fail_on_their_own(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id

    results = await asyncio.gather(
        *[store.add_span(llm_span(rid, aid, name=f"c{i}")) for i in range(20)],
        store.add_span(llm_span(rid, "at-missing")),
        store.update_attempt(rid, "latest", metadata={"seen": True}),
        return_exceptions=True,
    )

    spans, failed, attempt = results[:20], results[20], results[21]
    assert isinstance(failed, NotFoundError)
    assert attempt.metadata == {"seen": True}
    assert sorted(s.sequence_id for s in spans) == list(range(2, 22))
    assert len(await store.query_spans(rid)) == 21


async def test_unattributed_spans_are_stored_under_the_empty_rollout(store: LightningStore) -> None:
    before = len(await store.query_spans(""))

    stored = await store.add_many_spans([llm_span("", "", name="no-rollout") for _ in range(2)])

    assert len(stored) == 2 and all(s.sequence_id for s in stored)
    spans = await store.query_spans("")
    assert len(spans) == before + 2 and spans[-1].name == "no-rollout"


async def test_span_attributes_round_trip_exactly(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    attributes = {
        "agl.request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "return_token_ids": True},
        "agl.prompt_token_ids": list(range(151_000, 151_064)),
        "agl.choices": [{"index": 0, "token_ids": [5, -1, 2**31 - 1, 0, 7, 7, 7, 7], "logprobs": [-0.5] * 8}],
        "short": [1, 2, 3],
        "bools": [True, False] * 8,
        "huge": [2**40] + list(range(10)),
    }

    stored = await store.add_span(llm_span(rollout.rollout_id, rollout.attempt.attempt_id, attributes=attributes))
    (read,) = await store.query_spans(rollout.rollout_id, span_id=stored.span_id)

    assert read.attributes == attributes
    assert read.attributes["bools"][0] is True


async def test_query_spans_by_attempt_latest_and_filters(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rid, first = rollout.rollout_id, rollout.attempt.attempt_id
    retry = (await store.start_attempt(rid)).attempt.attempt_id
    await store.add_many_spans(
        [
            llm_span(rid, retry, name="agl.llm_call", parent_id="p1"),
            llm_span(rid, retry, name="tool.search"),
            reward_span(rid, retry, 1.0),
        ]
    )

    assert [s.name for s in await store.query_spans(rid, first)] == ["step"]
    assert [s.name for s in await store.query_spans(rid, "latest")] == ["agl.llm_call", "tool.search", "agl.reward"]
    assert [s.name for s in await store.query_spans(rid, name="agl.reward")] == ["agl.reward"]
    assert [s.name for s in await store.query_spans(rid, name_contains="tool")] == ["tool.search"]
    assert [s.name for s in await store.query_spans(rid, parent_id="p1")] == ["agl.llm_call"]
    either = await store.query_spans(rid, name="step", parent_id="p1", filter_logic="or")
    assert {s.name for s in either} == {"step", "agl.llm_call"}
    page = await store.query_spans(rid, sort_order="desc", limit=2, offset=1)
    assert [s.name for s in page] == ["tool.search", "agl.llm_call"] and page.total == 4
    assert await store.query_spans("ro-missing", "latest") == []


async def test_add_otel_span(store: LightningStore) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("agent.step") as otel:
        otel.set_attribute("agl.prompt_token_ids", list(range(12)))
    provider.shutdown()
    (readable,) = exporter.get_finished_spans()
    rollout = await running_rollout(store)

    span = await store.add_otel_span(rollout.rollout_id, rollout.attempt.attempt_id, readable)

    assert span is not None and span.name == "agent.step" and span.sequence_id == 2
    assert span.span_id == format(readable.context.span_id, "016x")
    (read,) = await store.query_spans(rollout.rollout_id, name="agent.step")
    assert read.attributes["agl.prompt_token_ids"] == list(range(12))
    assert read.start_time is not None and read.end_time >= read.start_time
    again = await store.add_otel_span(rollout.rollout_id, "latest", readable, sequence_id=9)
    assert again is None  # the same span of the same (latest) attempt: a duplicate


# --- resources --------------------------------------------------------------------------------


async def test_resources_are_versioned_and_the_last_write_is_latest(store: LightningStore) -> None:
    first = await store.add_resources(
        {"main_llm": LLM(endpoint="http://a/v1", model="m", sampling_parameters={"t": 1})}
    )
    second = await store.add_resources({"main_llm": ProxyLLM(endpoint="http://proxy:8080/v1", model="m")})
    assert first.version == 1 and (await store.get_latest_resources()).resources_id == second.resources_id

    updated = await store.update_resources(first.resources_id, {"main_llm": LLM(endpoint="http://b/v1", model="m")})

    assert updated.version == 2 and updated.create_time == first.create_time
    latest = await store.get_latest_resources()
    assert latest.resources_id == first.resources_id and latest.resources["main_llm"].endpoint == "http://b/v1"
    assert (await store.get_resources_by_id(second.resources_id)).resources["main_llm"].resource_type == "proxy_llm"
    assert await store.get_resources_by_id("rs-missing") is None

    created = await store.update_resources("rs-named", {"prompt": PromptTemplate(template="{q}")})
    assert created.version == 1 and (await store.get_latest_resources()).resources_id == "rs-named"
    page = await store.query_resources(sort_by="version", sort_order="desc", limit=1)
    assert page[0].resources_id == first.resources_id and page.total >= 3
    assert [r.resources_id for r in await store.query_resources(resources_id="rs-named")] == ["rs-named"]
    assert [r.resources_id for r in await store.query_resources(resources_id_contains="-named")] == ["rs-named"]


# --- workers ----------------------------------------------------------------------------------


async def test_worker_status_follows_its_attempts(store: LightningStore) -> None:
    assert await store.get_worker_by_id("w-new") is None
    hello = await store.update_worker("w-new", heartbeat_stats={"gpu_util": 0.5})
    assert hello.last_heartbeat_time is not None and hello.heartbeat_stats == {"gpu_util": 0.5}

    assert await store.dequeue_rollout(worker_id="w-new") is None
    assert (await store.get_worker_by_id("w-new")).status == "idle"

    await store.enqueue_rollout(input="work")
    claimed = await store.dequeue_rollout(worker_id="w-new")
    busy = await store.get_worker_by_id("w-new")
    assert busy.status == "busy" and busy.current_attempt_id == claimed.attempt.attempt_id
    assert busy.last_dequeue_time is not None and busy.heartbeat_stats == {"gpu_util": 0.5}

    await store.update_attempt(claimed.rollout_id, "latest", status="succeeded")
    idle = await store.get_worker_by_id("w-new")
    assert idle.status == "idle" and idle.current_rollout_id is None

    workers = await store.query_workers(status_in=["idle"], worker_id_contains="w-ne")
    assert [w.worker_id for w in workers] == ["w-new"] and workers.total == 1
    assert await store.query_workers(status_in=["busy"], worker_id_contains="w-ne") == []


# --- waiting ----------------------------------------------------------------------------------


async def test_wait_for_rollouts_returns_finished_ones(store: LightningStore) -> None:
    done = await running_rollout(store)
    pending = await running_rollout(store)
    await store.update_attempt(done.rollout_id, "latest", status="succeeded")

    now = await store.wait_for_rollouts(rollout_ids=[done.rollout_id, pending.rollout_id], timeout=0)
    assert [r.rollout_id for r in now] == [done.rollout_id]
    short = await store.wait_for_rollouts(rollout_ids=[pending.rollout_id], timeout=0.1)
    assert short == []

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        await store.update_attempt(pending.rollout_id, "latest", status="failed")

    finisher = asyncio.create_task(finish_soon())
    both = await store.wait_for_rollouts(rollout_ids=[done.rollout_id, pending.rollout_id], timeout=PATIENCE_S)
    await finisher
    assert [(r.rollout_id, r.status) for r in both] == [(done.rollout_id, "succeeded"), (pending.rollout_id, "failed")]

    # Ids the store does not know are not waited for.
    assert await store.wait_for_rollouts(rollout_ids=["ro-missing"], timeout=PATIENCE_S) == []
    known = await store.wait_for_rollouts(rollout_ids=["ro-missing", done.rollout_id], timeout=PATIENCE_S)
    assert [r.rollout_id for r in known] == [done.rollout_id]


# --- retention and statistics -------------------------------------------------------------------


async def test_delete_rollouts_removes_finished_ones_with_their_spans(store: LightningStore) -> None:
    done = await running_rollout(store)
    active = await running_rollout(store)
    await store.update_attempt(done.rollout_id, "latest", status="succeeded")

    with pytest.raises(ConflictError):
        await store.delete_rollouts([done.rollout_id, active.rollout_id])
    assert await store.get_rollout_by_id(done.rollout_id) is not None

    assert await store.delete_rollouts([done.rollout_id]) == 1
    assert await store.get_rollout_by_id(done.rollout_id) is None
    assert await store.query_spans(done.rollout_id) == []
    assert await store.query_attempts(done.rollout_id) == []
    assert await store.get_rollout_by_id(active.rollout_id) is not None


async def test_expire_rollouts_deletes_finished_ones_older_than_given(store: LightningStore) -> None:
    done = await running_rollout(store)
    active = await running_rollout(store)
    await store.update_attempt(done.rollout_id, "latest", status="succeeded")

    assert await store.expire_rollouts(3600) == 0
    await asyncio.sleep(0.05)
    assert await store.expire_rollouts(0) >= 1
    assert await store.get_rollout_by_id(done.rollout_id) is None
    assert await store.get_rollout_by_id(active.rollout_id) is not None


async def test_statistics_count_everything(store: LightningStore) -> None:
    before = await store.statistics()
    rollout = await running_rollout(store)
    await store.enqueue_rollout(input="waiting")
    await store.add_resources({"llm": LLM(endpoint="http://x/v1", model="m")})

    stats = await store.statistics()

    assert stats.total_rollouts == before.total_rollouts + 2
    assert stats.total_attempts == before.total_attempts + 1
    assert stats.total_spans == before.total_spans + 1
    assert stats.total_resources == before.total_resources + 1
    assert stats.rollouts_by_status.get("running", 0) == before.rollouts_by_status.get("running", 0) + 1
    assert stats.rollouts_by_status.get("queuing", 0) == before.rollouts_by_status.get("queuing", 0) + 1
    assert stats.total_workers >= 1 and rollout.rollout_id


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.query_rollouts(status_in=["finished"]), "status_in"),
        (lambda s: s.query_rollouts(limit=-2), "limit"),
        (lambda s: s.query_rollouts(offset=-1), "offset"),
        (lambda s: s.query_rollouts(sort_by="no_such_field"), "sort_by"),
        (lambda s: s.query_rollouts(mode="play"), "mode"),
        (lambda s: s.query_spans("r", sort_by="no_such_field"), "sort_by"),
        (lambda s: s.query_workers(status_in=["asleep"]), "status_in"),
        (lambda s: s.enqueue_rollout(input=1, mode="play"), "mode"),
    ],
)
async def test_invalid_values_name_the_field(store: LightningStore, call: Callable, field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        await call(store)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s: s.query_rollouts(limit=2**63), "limit"),
        (lambda s: s.query_rollouts(offset=2**63), "offset"),
        (lambda s: s.query_spans("r", limit=MAX_INTEGER + 1), "limit"),
        (lambda s: s.query_attempts("r", offset=2**64 - 1), "offset"),
        (lambda s: s.query_workers(limit=2**63 - 1), "limit"),
        (lambda s: s.query_resources(offset=2**63), "offset"),
        (lambda s: s.dequeue_many_rollouts(limit=2**63), "limit"),
    ],
)
async def test_integers_past_2_to_the_53_are_refused_naming_the_field(
    store: LightningStore, call: Callable, field: str
) -> None:
    with pytest.raises(InvalidInputError, match=field):
        await call(store)


async def test_the_largest_sequence_id_is_the_last_a_rollout_gets(store: LightningStore) -> None:
    rollout = await running_rollout(store)
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    before = await store.statistics()
    for too_big in (MAX_INTEGER + 1, 2**63 - 1, 2**63, 2**64 - 1):
        with pytest.raises(InvalidInputError, match="sequence_id"):
            await store.add_span(llm_span(rollout_id, attempt_id, sequence_id=too_big))
    assert (await store.statistics()).total_spans == before.total_spans

    last = await store.add_span(llm_span(rollout_id, attempt_id, sequence_id=MAX_INTEGER))
    assert last is not None and last.sequence_id == MAX_INTEGER
    # Like a PostgreSQL sequence at its maximum: no id past it is ever issued.
    with pytest.raises(ConflictError, match="no sequence ids left"):
        await store.add_span(llm_span(rollout_id, attempt_id))
    with pytest.raises(ConflictError, match="no sequence ids left"):
        await store.get_next_span_sequence_id(rollout_id, attempt_id)

    spans = await store.query_spans(rollout_id)
    assert [type(span.sequence_id) for span in spans] == [int, int]
    assert spans[-1].sequence_id == MAX_INTEGER


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """A value `depth` objects and arrays deep (more when `leaf` is itself a container)."""
    value = leaf
    for level in range(depth):
        value = {"level": value} if level % 2 else [value]
    return value


async def test_json_nested_to_the_limit_reads_back_everywhere(store: LightningStore) -> None:
    deepest = nested(MAX_JSON_DEPTH)
    queued = await store.enqueue_rollout(input=deepest, metadata={"m": nested(MAX_JSON_DEPTH - 1)})
    assert (await store.get_rollout_by_id(queued.rollout_id)) == queued
    assert queued in await store.query_rollouts(rollout_id_in=[queued.rollout_id])
    claimed = await store.dequeue_many_rollouts(limit=10_000)
    assert [r.input for r in claimed if r.rollout_id == queued.rollout_id] == [deepest]

    rollout = next(r for r in claimed if r.rollout_id == queued.rollout_id)
    attributes = {
        "tokens": nested(MAX_JSON_DEPTH - 2, leaf=list(range(8))),  # token ids at the deepest level
        "text": nested(MAX_JSON_DEPTH - 1),
    }
    event = Event(name="e", attributes={"x": nested(MAX_JSON_DEPTH - 3)})
    span = llm_span(rollout.rollout_id, rollout.attempt.attempt_id, attributes=attributes, events=[event])
    assert await store.add_span(span) is not None
    (read,) = await store.query_spans(rollout.rollout_id)
    assert read.attributes == attributes and read.events[0].attributes == {"x": nested(MAX_JSON_DEPTH - 3)}
    await store.update_attempt(rollout.rollout_id, "latest", metadata={"m": nested(MAX_JSON_DEPTH - 1)})
    await store.update_worker("deep-worker", heartbeat_stats={"s": nested(MAX_JSON_DEPTH - 1)})
    assert (await store.get_worker_by_id("deep-worker")).heartbeat_stats == {"s": nested(MAX_JSON_DEPTH - 1)}


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s, r, a: s.enqueue_rollout(input=nested(MAX_JSON_DEPTH + 1)), "input"),
        (lambda s, r, a: s.start_rollout(input=1, metadata={"m": nested(MAX_JSON_DEPTH)}), "metadata"),
        (lambda s, r, a: s.update_rollout(r, input=nested(MAX_JSON_DEPTH + 1)), "input"),
        (lambda s, r, a: s.update_attempt(r, a, metadata={"m": nested(MAX_JSON_DEPTH)}), "metadata"),
        (lambda s, r, a: s.update_worker("w", heartbeat_stats={"s": nested(MAX_JSON_DEPTH)}), "heartbeat_stats"),
        (lambda s, r, a: s.add_span(llm_span(r, a, attributes={"x": nested(MAX_JSON_DEPTH)})), "attributes"),
        (
            lambda s, r, a: s.add_many_spans(
                [llm_span(r, a), llm_span(r, a, attributes={"x": nested(MAX_JSON_DEPTH - 1, leaf=list(range(8)))})]
            ),
            r"spans\[1\].attributes",
        ),
        (
            lambda s, r, a: s.add_span(llm_span(r, a, resource={"attributes": {"x": nested(MAX_JSON_DEPTH)}})),
            "resource",
        ),
    ],
)
async def test_json_nested_past_the_limit_is_refused_before_storing(
    store: LightningStore, call: Callable, field: str
) -> None:
    rollout = await running_rollout(store)
    before = (await store.statistics()).model_dump(exclude={"uptime", "database_bytes"})
    with pytest.raises(InvalidInputError, match=f"{field} nests deeper than {MAX_JSON_DEPTH} levels"):
        await call(store, rollout.rollout_id, rollout.attempt.attempt_id)
    assert (await store.statistics()).model_dump(exclude={"uptime", "database_bytes"}) == before
    assert (await store.get_rollout_by_id(rollout.rollout_id)) is not None
    assert await store.query_rollouts(limit=10_000)


async def test_an_unsupported_sort_field_is_worded_as_agent_lightning_words_it(store: LightningStore) -> None:
    with pytest.raises(InvalidInputError, match="^Invalid sort_by: nonsense, allowed fields are: .*rollout_id"):
        await store.query_rollouts(sort_by="nonsense")
    with pytest.raises(InvalidInputError, match="^Invalid sort_by: nonsense, allowed fields are: .*worker_id"):
        await store.query_workers(sort_by="nonsense")


async def test_unknown_rollout_status_is_invalid(store: LightningStore) -> None:
    queued = await store.enqueue_rollout(input=1)

    with pytest.raises(InvalidInputError, match="status"):
        await store.update_rollout(queued.rollout_id, status="done")
    with pytest.raises(NotFoundError):
        await store.update_rollout("ro-missing", status="cancelled")


async def test_a_closed_store_refuses_calls(store: LightningStore) -> None:
    await store.close()

    with pytest.raises(StoreClosedError):
        await store.enqueue_rollout(input=1)
