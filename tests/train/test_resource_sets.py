"""One resource set per weight version: the trainer registers its replicas with the proxy at every
publish (a restarted proxy gets them back), but a publish of the version already published reuses
its set, so the training page has one row per step."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agl_proxy.server.proxy import LLMProxy
from agl_store.sqlite import SQLiteStore
from agl_train.runner.proxy_control import ProxyControl, publish_replicas
from tests.proxy.helpers import serve


def replica_app() -> Starlette:
    """What `publish_replicas` asks a vLLM replica: the model it serves."""

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    return Starlette(routes=[Route("/v1/models", models)])


async def test_a_step_publishes_one_resource_set(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "agl.db") as store, serve(replica_app()) as replica:
        proxy = LLMProxy(model_list=[], port=0)
        await proxy.start()
        control = ProxyControl(proxy.url)
        address = replica.removeprefix("http://")
        published: dict = {}
        try:
            # As fit() does: validation, then per step the rollouts' publish and the one after the update.
            ids = []
            for version in ("1", "1", "2", "2", "3"):
                ids.append(await publish_replicas(store, control, [address], version=version, published=published))
        finally:
            await control.aclose()
            await proxy.stop()

        assert ids[0] == ids[1] and ids[2] == ids[3] and len(set(ids)) == 3
        assert len(await store.query_resources()) == 3
