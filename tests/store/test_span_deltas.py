"""LLM calls stored as deltas (`agl_store/sqlite/deltas.py`): readers see exactly what a store
that keeps every span whole returns, whatever the conversation's shape and the writers' order."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agl_store import Span, call_span
from agl_store.errors import InvalidInputError
from agl_store.sqlite import SQLiteStore, retention
from agl_store.sqlite.schema import MIGRATIONS, apply_migrations
from agl_store.sqlite.transactions import Txn

from .http_server import start_store_server

SYSTEM = {"role": "system", "content": "You are a careful agent. " * 40}


def call(span_id: str, prompt: list[int], messages: list[Any], responses: list[list[int]], **extra: Any) -> Span:
    """An `agl.llm_call` span shaped as the proxy writes it (the response body names the
    prompt's ids again, as vLLM's does)."""
    choices = [
        {"index": i, "token_ids": ids, "logprobs": [-0.5] * len(ids), "finish_reason": "stop"}
        for i, ids in enumerate(responses)
    ]
    return Span(
        rollout_id="",
        attempt_id="",
        trace_id="trace",
        span_id=span_id,
        name=call_span.NAME,
        attributes={
            call_span.REQUEST: {"model": "m", "messages": messages, "n": len(responses)},
            call_span.RESPONSE: {
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": "ok"}} for i in range(len(responses))
                ],
                "prompt_token_ids": prompt,
            },
            call_span.PROMPT_TOKEN_IDS: prompt,
            call_span.CHOICES: choices,
            **extra,
        },
    )


def conversation(rng: random.Random, turns: int) -> list[Span]:
    """Calls of one attempt: mostly each extending the last, with branches from earlier calls
    (sub-agents, n > 1), edited histories, fresh prompts (compaction) and short prompts."""
    made: list[tuple[list[int], list[Any], list[list[int]]]] = []
    spans = []
    for turn in range(turns):
        kind = rng.random()
        if not made or kind < 0.1:
            prompt = [rng.randrange(1, 50_000) for _ in range(rng.choice([3, 40, 300, 700]))]
            messages: list[Any] = [SYSTEM, {"role": "user", "content": f"task {turn}"}]
        else:
            prompt0, messages0, responses0 = made[-1] if kind < 0.7 else rng.choice(made)
            choice = rng.randrange(len(responses0))
            prompt = prompt0 + responses0[choice]
            messages = [*messages0, {"role": "assistant", "content": f"answer {turn}"}]
            if kind > 0.9:  # an edited history: cut somewhere, then new ids
                prompt = prompt[: rng.randrange(len(prompt) + 1)]
                messages = messages[: rng.randrange(len(messages) + 1)]
            prompt = prompt + [rng.randrange(1, 50_000) for _ in range(rng.choice([0, 5, 60, 300]))]
            messages = [*messages, {"role": "tool", "content": "result " * rng.randrange(1, 50)}]
        responses = [
            [rng.randrange(1, 50_000) for _ in range(rng.choice([1, 7, 30]))] for _ in range(rng.choice([1, 1, 2]))
        ]
        made.append((prompt, messages, responses))
        spans.append(call(f"call-{turn}", prompt, messages, responses, **{"agl.sampling": {"seed": turn}}))
    return spans


def comparable(spans: Any) -> list[dict[str, Any]]:
    return [span.model_dump(exclude={"rollout_id", "attempt_id"}) for span in spans]


async def write(store: SQLiteStore, spans: list[Span], rng: random.Random) -> tuple[str, str]:
    """Write `spans` into a new attempt, in batches of random size, in a shuffled order when
    the rng says so (spans arriving out of order)."""
    attempted = await store.start_rollout({"q": 1})
    ids = (attempted.rollout_id, attempted.attempt.attempt_id)
    order = list(range(len(spans)))
    if rng.random() < 0.3:
        rng.shuffle(order)
    start = 0
    while start < len(order):
        size = rng.choice([1, 1, 3])
        batch = [
            spans[i].model_copy(update={"rollout_id": ids[0], "attempt_id": ids[1], "sequence_id": i + 1})
            for i in order[start : start + size]
        ]
        if size == 1:
            await store.add_span(batch[0])
        else:
            await store.add_many_spans(batch)
        start += size
    return ids


def stored_as_deltas(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM spans WHERE base_pk IS NOT NULL").fetchone()[0])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), turns=st.integers(1, 12))
def test_every_read_equals_a_store_without_deltas(seed: int, turns: int) -> None:
    async def run() -> None:
        spans = conversation(random.Random(seed), turns)
        async with SQLiteStore(":memory:") as deltas, SQLiteStore(":memory:", deltas=False) as whole:
            written = [await write(store, spans, random.Random(seed)) for store in (deltas, whole)]
            reads = [
                comparable(await store.query_spans(*ids)) for store, ids in zip((deltas, whole), written, strict=True)
            ]
            assert reads[0] == reads[1]
            assert [span["attributes"] for span in reads[0]] == [span.attributes for span in spans]
            # One span alone, the parents it names are not in the page.
            for span in spans[-2:]:
                alone = [
                    await store.query_spans(*ids, span_id=span.span_id)
                    for store, ids in zip((deltas, whole), written, strict=True)
                ]
                assert comparable(alone[0]) == comparable(alone[1])

    asyncio.run(run())


async def test_a_long_conversation_is_stored_as_deltas_and_read_whole(tmp_path: Path) -> None:
    spans = conversation(random.Random(7), 24)
    async with SQLiteStore(tmp_path / "agl.db") as store:
        ids = await write(store, spans, random.Random(1))
        assert [s.attributes for s in await store.query_spans(*ids)] == [s.attributes for s in spans]
        # Over HTTP too, plain JSON (agent-lightning 0.3 clients) and packed (agl's client).
    assert stored_as_deltas(tmp_path / "agl.db") >= 15
    async with start_store_server(tmp_path / "agl.db") as client:
        read = await client.query_spans(*ids)
        assert [s.attributes for s in read] == [s.attributes for s in spans]


async def test_interleaved_writers_of_one_attempt(tmp_path: Path) -> None:
    """Sub-agents of one attempt write their conversations at once, through two store
    servers' worth of clients and two processes' worth of stores on one file."""
    rng = random.Random(3)
    agents = [
        [span.model_copy(update={"span_id": f"agent{a}-{span.span_id}"}) for span in conversation(rng, 10)]
        for a in range(4)
    ]
    path = tmp_path / "agl.db"
    async with SQLiteStore(path) as first, SQLiteStore(path) as second:
        attempted = await first.start_rollout({"q": 1})
        rid, aid = attempted.rollout_id, attempted.attempt.attempt_id

        async def agent(index: int) -> None:
            for span in agents[index]:
                store = (first, second)[rng.randrange(2)]  # another process wrote the last turn
                await store.add_span(span.model_copy(update={"rollout_id": rid, "attempt_id": aid}))
                await asyncio.sleep(0)

        await asyncio.gather(*(agent(i) for i in range(len(agents))))
        read = {span.span_id: span.attributes for span in await second.query_spans(rid, aid)}
    assert read == {span.span_id: span.attributes for spans in agents for span in spans}
    assert stored_as_deltas(path) >= 20


async def test_a_deletion_cut_short_leaves_readable_spans(tmp_path: Path) -> None:
    path = tmp_path / "agl.db"
    spans = conversation(random.Random(5), 12)
    async with SQLiteStore(path) as store:
        rid, aid = await write(store, spans, random.Random(2))
        await store.update_attempt(rid, aid, status="succeeded")
    with sqlite3.connect(path, isolation_level=None) as conn:  # one chunk of 5 spans, then a "kill"
        conn.execute("BEGIN IMMEDIATE")
        retention.delete_finished(Txn(conn), [rid], 5)
        conn.execute("COMMIT")
    async with SQLiteStore(path) as store:
        left = await store.query_spans(rid, aid)
        assert [s.attributes for s in left] == [s.attributes for s in spans[: len(left)]]
        assert len(left) == 7


OLD_REST = (
    b'{"status": {"status_code": "UNSET", "description": null}, "events": [], "links": [], '
    b'"context": null, "parent": null, "resource": {"attributes": {}, "schema_url": ""}}'
)


DELTAS_MIGRATION = "0006_span_deltas"


def write_old_database(path: Path, spans: list[Span]) -> tuple[str, str]:
    """A database as the store before deltas wrote it: the migrations before, and spans as its
    `span_to_row` stored them (`attributes` skeleton + int32 `tokens`)."""
    from agl_store.packed_attributes import pack_attributes

    with sqlite3.connect(path, isolation_level=None) as conn:
        apply_migrations(conn, MIGRATIONS[: [name for name, _ in MIGRATIONS].index(DELTAS_MIGRATION)])
        conn.execute(
            "INSERT INTO rollouts (rollout_id, input, start_time, end_time, mode, resources_id, status, config, "
            "metadata, queue_seq, attempt_count, latest_attempt_id) VALUES ('ro-old', '{}', 1.0, 2.0, 'train', NULL, "
            "'succeeded', '{}', NULL, NULL, 1, 'at-old')"
        )
        conn.execute(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence_id, start_time, end_time, status) "
            "VALUES ('ro-old', 'at-old', 1, 1.0, 2.0, 'succeeded')"
        )
        conn.execute("INSERT INTO span_counters (rollout_id, value) VALUES ('ro-old', ?)", (len(spans),))
        for seq, span in enumerate(spans, start=1):
            text, blob = pack_attributes(span.attributes)
            conn.execute(
                "INSERT INTO spans (rollout_id, attempt_id, sequence_id, trace_id, span_id, parent_id, name, "
                "start_time, end_time, status_code, attributes, tokens, rest) "
                "VALUES ('ro-old', 'at-old', ?, 'trace', ?, NULL, ?, NULL, NULL, 'UNSET', ?, ?, ?)",
                (
                    seq,
                    span.span_id,
                    span.name,
                    text,
                    blob,
                    OLD_REST,
                ),
            )
    return "ro-old", "at-old"


async def test_a_database_of_the_previous_schema_opens_with_nothing_lost(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    spans = conversation(random.Random(11), 8)
    rid, aid = write_old_database(path, spans[:6])
    async with SQLiteStore(path) as store:
        assert [s.attributes for s in await store.query_spans(rid, aid)] == [s.attributes for s in spans[:6]]
        # New calls of the old attempt are stored (whole: old rows carry no digest) and read back.
        await store.add_many_spans(
            [span.model_copy(update={"rollout_id": rid, "attempt_id": aid}) for span in spans[6:]]
        )
        assert [s.attributes for s in await store.query_spans(rid, aid)] == [s.attributes for s in spans]
    with sqlite3.connect(path) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
    assert names == {name for name, _ in MIGRATIONS}


@pytest.mark.parametrize("deltas", [True, False])
async def test_spans_that_are_not_calls_are_stored_as_they_came(tmp_path: Path, deltas: bool) -> None:
    async with SQLiteStore(tmp_path / "agl.db", deltas=deltas) as store:
        attempted = await store.start_rollout({"q": 1})
        ids = (attempted.rollout_id, attempted.attempt.attempt_id)
        plain = Span(
            rollout_id=ids[0],
            attempt_id=ids[1],
            trace_id="t",
            span_id="s",
            name="tool",
            attributes={"x": list(range(20))},
        )
        await store.add_span(plain)
        assert [s.attributes for s in await store.query_spans(*ids)] == [{"x": list(range(20))}]


def rebuilt(spans: list[Span]) -> dict[str, Any]:
    """Each call's prompt ids and messages from a compact read, by span id."""
    whole: dict[str, tuple[list[int], list[Any], list[list[int]]]] = {}
    by_id = {span.span_id: span for span in spans}

    def resolve(span_id: str) -> tuple[list[int], list[Any], list[list[int]]]:
        if span_id not in whole:
            attributes = by_id[span_id].attributes
            prompt = list(attributes[call_span.PROMPT_TOKEN_IDS])
            messages = list(attributes[call_span.REQUEST]["messages"])
            delta = attributes.get(call_span.DELTA)
            if delta is not None:
                parent_prompt, parent_messages, parent_choices = resolve(delta["parent"])
                context = parent_prompt + (parent_choices[delta["choice"]] if delta["choice"] is not None else [])
                prompt = context[: delta["prefix"]] + prompt
                messages = parent_messages[: delta["messages"]] + messages
            choices = [list(choice["token_ids"]) for choice in attributes[call_span.CHOICES]]
            whole[span_id] = (prompt, messages, choices)
        return whole[span_id]

    return {span_id: resolve(span_id)[:2] for span_id in by_id}


async def test_a_compact_read_is_each_delta_and_its_parent(tmp_path: Path) -> None:
    spans = conversation(random.Random(9), 16)
    expected = {
        s.span_id: (s.attributes[call_span.PROMPT_TOKEN_IDS], s.attributes[call_span.REQUEST]["messages"])
        for s in spans
    }
    async with SQLiteStore(tmp_path / "agl.db") as store:
        ids = await write(store, spans, random.Random(4))
        compact = list(await store.query_spans(*ids, compact=True))
        assert rebuilt(compact) == expected
        assert sum(call_span.DELTA in s.attributes for s in compact) >= 10
    async with start_store_server(tmp_path / "agl.db") as client:
        assert rebuilt(list(await client.query_spans(*ids, compact=True))) == expected
    async with SQLiteStore(":memory:", deltas=False) as whole:  # whole spans, no parents
        ids = await write(whole, spans, random.Random(4))
        read = await whole.query_spans(*ids, compact=True)
        assert not any(call_span.DELTA in s.attributes for s in read)
        assert rebuilt(list(read)) == expected


async def test_a_read_of_some_attributes_leaves_the_others_out(tmp_path: Path) -> None:
    spans = conversation(random.Random(5), 8)
    wanted = [call_span.PROMPT_TOKEN_IDS, call_span.CHOICES]
    async with SQLiteStore(tmp_path / "agl.db") as store:
        ids = await write(store, spans, random.Random(2))
        whole = list(await store.query_spans(*ids))
        compact = list(await store.query_spans(*ids, compact=True))
        assert [s.attributes for s in await store.query_spans(*ids, attributes=wanted)] == [
            {key: s.attributes[key] for key in wanted} for s in whole
        ]
        some = list(await store.query_spans(*ids, compact=True, attributes=wanted))
        assert [s.attributes for s in some] == [
            {key: value for key, value in s.attributes.items() if key in {*wanted, call_span.DELTA}} for s in compact
        ]
        assert any(call_span.DELTA in s.attributes for s in some)
        reward = Span(rollout_id=ids[0], attempt_id=ids[1], name="agl.reward", attributes={"v": 0.1 + 0.2, "x": "y"})
        await store.add_span(reward)  # a float SQLite would print rounded
        assert (await store.query_spans(*ids, name="agl.reward", attributes=["v"]))[0].attributes == {"v": 0.1 + 0.2}
        with pytest.raises(InvalidInputError, match="attributes"):
            await store.query_spans(*ids, attributes=call_span.CHOICES)  # type: ignore[arg-type]
    async with start_store_server(tmp_path / "agl.db") as client:
        got = list(await client.query_spans(*ids, compact=True, attributes=wanted, name=call_span.NAME))
        assert [s.attributes for s in got] == [s.attributes for s in some]


def linear_conversation(rng: random.Random, turns: int) -> list[Span]:
    """Calls each extending the last one's whole context: each is a delta of the one before."""
    prompt = [rng.randrange(1, 50_000) for _ in range(60)]
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "task"}]
    spans = []
    for turn in range(turns):
        response = [rng.randrange(1, 50_000) for _ in range(12)]
        spans.append(call(f"call-{turn}", prompt, messages, [response]))
        prompt = prompt + response + [rng.randrange(1, 50_000) for _ in range(9)]
        messages = [*messages, {"role": "assistant", "content": f"answer {turn}"}, {"role": "tool", "content": "r"}]
    return spans


def parents(path: Path) -> dict[str, str | None]:
    """Each stored span's parent span id (None when stored whole)."""
    with sqlite3.connect(path) as conn:
        return dict(
            conn.execute("SELECT s.span_id, p.span_id FROM spans s LEFT JOIN spans p ON p.pk = s.base_pk").fetchall()
        )


@pytest.mark.parametrize("batched", [False, True])
async def test_a_parent_whose_row_changed_under_the_index_is_not_used(tmp_path: Path, batched: bool) -> None:
    """The writer's index remembers calls by pk; another process that replaced one's row (or
    deleted it) leaves the index stale: its stamp check, in the insert of a single span or
    in one query for a batch, keeps a delta from naming that row."""
    path = tmp_path / "agl.db"
    spans = linear_conversation(random.Random(21), 6)
    other = linear_conversation(random.Random(22), 1)[0]  # another call, unrelated ids
    async with SQLiteStore(path) as store:
        attempted = await store.start_rollout({"q": 1})
        ids = (attempted.rollout_id, attempted.attempt.attempt_id)
        mine = [span.model_copy(update={"rollout_id": ids[0], "attempt_id": ids[1]}) for span in spans]
        for span in mine[:3]:
            await store.add_span(span)
        assert parents(path) == {"call-0": None, "call-1": "call-0", "call-2": "call-1"}
        with sqlite3.connect(path, isolation_level=None) as conn:
            # call-2's row now holds another call (a new stamp); call-1's row is gone.
            from agl_store.packed_attributes import pack_attributes

            text, blob = pack_attributes(other.attributes)
            conn.execute(
                "UPDATE spans SET attributes = ?, tokens = ?, base_pk = NULL, delta = NULL, stamp = X'00' "
                "WHERE span_id = 'call-2'",
                (text, blob),
            )
            conn.execute("UPDATE spans SET span_id = 'gone' WHERE span_id = 'call-1'")
            conn.execute("DELETE FROM spans WHERE span_id = 'gone'")
        if batched:
            await store.add_many_spans(mine[3:])
        else:
            for span in mine[3:]:
                await store.add_span(span)
        read = {s.span_id: s.attributes for s in await store.query_spans(*ids)}
    assert read == {
        "call-0": spans[0].attributes,
        "call-2": other.attributes,
        **{span.span_id: span.attributes for span in spans[3:]},
    }
    stored = parents(path)
    assert stored["call-3"] in (None, "call-0")  # never the replaced row
    assert stored["call-4"] == "call-3" and stored["call-5"] == "call-4"


async def test_duplicates_in_a_batch_of_calls_are_ignored_and_no_delta_names_them(tmp_path: Path) -> None:
    path = tmp_path / "agl.db"
    spans = linear_conversation(random.Random(23), 8)
    async with SQLiteStore(path) as store, SQLiteStore(":memory:", deltas=False) as whole:
        read = []
        for target in (store, whole):
            attempted = await target.start_rollout({"q": 1})
            ids = (attempted.rollout_id, attempted.attempt.attempt_id)
            mine = [span.model_copy(update={"rollout_id": ids[0], "attempt_id": ids[1]}) for span in spans]
            assert len(await target.add_many_spans(mine[:3])) == 3
            # Two stored already, one twice in the batch (its copy differs: it is ignored).
            changed = mine[5].model_copy(update={"attributes": {**mine[5].attributes, "x": 1}})
            added = await target.add_many_spans([mine[1], mine[3], mine[2], mine[4], mine[5], changed, mine[6]])
            assert [s.span_id for s in added] == ["call-3", "call-4", "call-5", "call-6"]
            read.append(comparable(await target.query_spans(*ids)))
    assert read[0] == read[1]
    assert [span["attributes"] for span in read[0]] == [span.attributes for span in spans[:7]]
    assert parents(path) == {"call-0": None, **{f"call-{i}": f"call-{i - 1}" for i in range(1, 7)}}


async def test_messages_equal_in_python_but_not_as_json_are_not_shared() -> None:
    """1, 1.0 and True are equal in Python, and so are dicts in another key order; as JSON
    they differ, so a delta never takes such a message from its parent."""
    prompt = list(range(1, 40))
    first = [SYSTEM, {"role": "user", "content": "a", "n": 1, "x": {"p": 1, "q": 2}}]
    variants = [
        [SYSTEM, {"role": "user", "content": "a", "n": 1.0, "x": {"p": 1, "q": 2}}],
        [SYSTEM, {"role": "user", "content": "a", "n": True, "x": {"p": 1, "q": 2}}],
        [SYSTEM, {"role": "user", "content": "a", "n": 1, "x": {"q": 2, "p": 1}}],
        [SYSTEM, {"content": "a", "role": "user", "n": 1, "x": {"p": 1, "q": 2}}],
        [*first, {"role": "tool", "content": "r"}],  # extends `first`: shares both
    ]
    spans = [call("call-0", prompt, first, [[7] * 9])]
    spans += [call(f"call-{i + 1}", prompt + [7] * 9 + [i], m, [[8] * 9]) for i, m in enumerate(variants)]
    async with SQLiteStore(":memory:") as deltas, SQLiteStore(":memory:", deltas=False) as whole:
        rng = random.Random(0)
        written = [await write(store, spans, rng) for store in (deltas, whole)]
        reads = [comparable(await store.query_spans(*ids)) for store, ids in zip((deltas, whole), written, strict=True)]
        compact = {
            s.span_id: s.attributes.get(call_span.DELTA) for s in await deltas.query_spans(*written[0], compact=True)
        }
    assert reads[0] == reads[1]
    assert orjson.dumps([s["attributes"] for s in reads[0]]) == orjson.dumps([s.attributes for s in spans])
    assert all(compact[f"call-{i}"]["messages"] < 2 for i in range(1, 5))  # never the changed message
    assert compact["call-5"]["messages"] == 2


async def test_a_writer_that_extends_the_messages_list_it_passed_reads_back_what_it_wrote(tmp_path: Path) -> None:
    """An agent loop appends to one messages list and passes it to every call: the store keeps
    what each call held when it was written, never the list as it grew since."""
    rng = random.Random(31)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "task"}]
    prompt = [rng.randrange(1, 50_000) for _ in range(60)]
    written = []
    async with SQLiteStore(tmp_path / "agl.db") as store:
        attempted = await store.start_rollout({"q": 1})
        ids = {"rollout_id": attempted.rollout_id, "attempt_id": attempted.attempt.attempt_id}
        for turn in range(4):
            response = [rng.randrange(1, 50_000) for _ in range(12)]
            span = call(f"call-{turn}", prompt, messages, [response]).model_copy(update=ids)
            await store.add_span(span)
            written.append(orjson.loads(orjson.dumps(span.attributes)))
            messages.append({"role": "assistant", "content": f"answer {turn}"})
            messages.append({"role": "tool", "content": "r"})
            prompt = prompt + response + [rng.randrange(1, 50_000) for _ in range(9)]
        read = [s.attributes for s in await store.query_spans(*ids.values())]
    assert [len(a[call_span.REQUEST]["messages"]) for a in read] == [2, 4, 6, 8]
    assert read == written
    assert stored_as_deltas(tmp_path / "agl.db") == 3
