"""The query model: every `query_*` method of the contract takes exactly its model's fields."""

from __future__ import annotations

import inspect

import pytest

from agl_store import Attempt, LightningStore, ResourcesUpdate, Rollout, Span, Worker
from agl_store.queries import AttemptQuery, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery
from agl_store.sqlite import SQLiteStore


@pytest.mark.parametrize(
    ("method", "model", "named_apart"),
    [
        (LightningStore.query_rollouts, RolloutQuery, ()),
        (LightningStore.query_attempts, AttemptQuery, ("rollout_id",)),
        (LightningStore.query_spans, SpanQuery, ()),
        (LightningStore.query_resources, ResourcesQuery, ()),
        (LightningStore.query_workers, WorkerQuery, ()),
    ],
)
def test_a_query_method_takes_its_models_fields_with_their_defaults(method, model, named_apart) -> None:
    parameters = dict(inspect.signature(method).parameters)
    del parameters["self"]
    for name in named_apart:
        del parameters[name]
    assert {name: p.default for name, p in parameters.items()} == {
        name: (inspect.Parameter.empty if field.is_required() else field.default)
        for name, field in model.model_fields.items()
    }


def test_a_models_sort_fields_are_fields_of_what_it_finds() -> None:
    for model, item in [
        (RolloutQuery, Rollout),
        (AttemptQuery, Attempt),
        (SpanQuery, Span),
        (ResourcesQuery, ResourcesUpdate),
        (WorkerQuery, Worker),
    ]:
        assert model.sort_fields <= set(item.model_fields), model.__name__


def test_a_request_leaves_out_list_filters_that_are_none_and_keeps_other_nones() -> None:
    query = RolloutQuery.of_call({"self": None, "status_in": None, "rollout_id_in": ("ro-1",), "mode": None})
    fields = query.request_fields()
    assert "status_in" not in fields
    assert fields["rollout_id_in"] == ["ro-1"]
    assert fields["mode"] is None and fields["limit"] == -1 and fields["sort_order"] == "asc"


async def test_query_keywords_and_the_model_find_the_same_page(tmp_path) -> None:
    async with SQLiteStore(tmp_path / "q.db") as store:
        for index in range(5):
            await store.enqueue_rollout({"i": index}, mode="train" if index % 2 else "val")
        by_keywords = await store.query_rollouts(mode="train", sort_by="start_time", sort_order="desc", limit=1)
        by_model = await store.find_rollouts(
            RolloutQuery(mode="train", sort_by="start_time", sort_order="desc", limit=1)
        )
        assert [r.rollout_id for r in by_keywords] == [r.rollout_id for r in by_model]
        assert by_keywords.total == by_model.total == 2
