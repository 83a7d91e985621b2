"""Kubernetes execution: the Job template rendered per rollout, and the Job's life through the API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_store.models import Attempt, AttemptedRollout
from agl_train.runner.env import RolloutEndpoints
from agl_train.runner.k8s import K8sRunner, KubeClient, job_name_for, render_job, yaml_escape
from tests.proxy.helpers import serve

from .fake_k8s import FakeKube

TEMPLATE = (Path(__file__).parents[2] / "examples" / "calc_agent" / "k8s_job.yaml.j2").read_text()
ENDPOINTS = RolloutEndpoints(base_url="http://proxy:8080/rollout/ro-1/attempt/at-1/v1", model="qwen", key="k")
TRICKY = [
    'He said "stop": then left',
    "key: value\n- not a list\n# not a comment",
    "multi\nline\r\nwith\ttabs and trailing backslash \\",
    "unicode ☃ 数学 🚀 and NEL\x85 LS\u2028 PS\u2029 BOM\ufeff",
    "{{ not jinja }} {% nor this %}",
    "",
    "'single' and `back` and & * ! | > % @",
]


def attempted(task: Any, rollout_id: str = "ro-1", attempt_id: str = "at-1") -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id=rollout_id,
        input=task,
        start_time=now,
        attempt=Attempt(rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=1, start_time=now),
    )


def rendered_env(manifest: dict[str, Any]) -> dict[str, str]:
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container["env"]}


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_yaml_escape_round_trips_any_text(text: str) -> None:
    assert yaml.safe_load(f"value: {yaml_escape(text)}") == {"value": text}


@pytest.mark.parametrize("question", TRICKY)
def test_the_example_template_renders_a_job_whose_env_carries_the_input_exactly(question: str) -> None:
    runner = K8sRunner(
        TEMPLATE, client=None, env_map={"QUESTION": "input.question", "ANSWER": "input.answer"}, timeout_s=60
    )  # type: ignore[arg-type]
    manifest = render_job(runner.template, runner.context(attempted({"question": question, "answer": 42}), ENDPOINTS))

    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert manifest["metadata"]["name"] == job_name_for("ro-1", "at-1")
    assert manifest["spec"]["backoffLimit"] == 0
    env = rendered_env(manifest)
    assert env["QUESTION"] == question
    assert env["ANSWER"] == "42"
    assert env["OPENAI_BASE_URL"] == ENDPOINTS.base_url
    assert env["AGL_ROLLOUT_ID"] == "ro-1"


def test_templates_that_are_not_jobs_are_refused() -> None:
    with pytest.raises(ValueError, match="batch/v1"):
        render_job("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", {})
    with pytest.raises(ValueError, match="invalid YAML"):
        render_job("apiVersion: batch/v1\nkind: Job\nmetadata: {name: {{ input }}\n", {"input": "a: b"})
    with pytest.raises(ValueError, match="spec.template"):
        render_job("apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec: {}\n", {})


def test_job_names_are_dns_labels() -> None:
    name = job_name_for("ro-ABC_def", "at-" + "x" * 80)
    assert len(name) <= 63 and name == name.lower() and "_" not in name


@pytest.fixture
async def kube():
    fake = FakeKube()
    async with serve(fake.app()) as url:
        client = KubeClient(url, namespace="agents", token=fake.token)
        yield fake, client
        await client.aclose()


async def test_a_completed_job_reports_the_reward_from_its_log_and_is_deleted(kube) -> None:
    fake, client = kube
    fake.log = 'thinking...\nAGL_RESULT {"reward": 1.0}\n'
    runner = K8sRunner(TEMPLATE, client, env_map={"QUESTION": "input.question"}, timeout_s=30, poll_s=0.01)

    outcome = await runner.run(attempted({"question": "2+2", "answer": "4"}), ENDPOINTS)

    assert (outcome.status, outcome.reward) == ("succeeded", 1.0)
    name = job_name_for("ro-1", "at-1")
    assert [job["metadata"]["name"] for job in fake.created] == [name]
    assert fake.deleted == [name]


async def test_a_failed_job_fails_the_rollout_with_its_log(kube) -> None:
    fake, client = kube
    fake.outcome, fake.log = "Failed", "Traceback: boom"
    runner = K8sRunner(TEMPLATE, client, env_map={}, timeout_s=30, poll_s=0.01)

    outcome = await runner.run(attempted({"question": "q"}), ENDPOINTS)

    assert outcome.status == "failed" and "boom" in outcome.message


async def test_a_job_past_the_timeout_is_deleted_and_the_rollout_timed_out(kube) -> None:
    fake, client = kube
    fake.outcome = None
    runner = K8sRunner(TEMPLATE, client, env_map={}, timeout_s=0.3, poll_s=0.01)

    outcome = await runner.run(attempted({"question": "q"}), ENDPOINTS)

    assert outcome.status == "timeout"
    assert fake.deleted == [job_name_for("ro-1", "at-1")] and fake.jobs == {}


async def test_a_missing_env_field_fails_before_any_job_is_created(kube) -> None:
    fake, client = kube
    runner = K8sRunner(TEMPLATE, client, env_map={"ANSWER": "input.answer"}, timeout_s=30, poll_s=0.01)

    outcome = await runner.run(attempted({"question": "q"}), ENDPOINTS)

    assert outcome.status == "failed" and "input.answer" in outcome.message
    assert fake.created == []


async def test_a_refused_create_fails_the_rollout(kube) -> None:
    fake, _ = kube
    async with serve(fake.app()) as url:
        client = KubeClient(url, token="wrong")
        outcome = await K8sRunner(TEMPLATE, client, env_map={}, timeout_s=30).run(
            attempted({"question": "q"}), ENDPOINTS
        )
        await client.aclose()
    assert outcome.status == "failed" and "401" in outcome.message


def test_a_kubeconfig_gives_server_namespace_and_token(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "dev",
                "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "agents"}}],
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://k8s.example:6443", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "abc"}}],
            }
        )
    )
    client = KubeClient.from_kubeconfig(path)
    assert (client.server, client.namespace) == ("https://k8s.example:6443", "agents")
