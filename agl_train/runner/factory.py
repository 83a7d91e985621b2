"""The runner the config asks for: local subprocesses, Kubernetes Jobs, or none (external runners)."""

from __future__ import annotations

from pathlib import Path

from .dispatch import Runner
from .local import LocalRunner
from .runner_settings import RunnerSettings


def make_runner(settings: RunnerSettings) -> Runner | None:
    """`LocalRunner` for `local.agent_class`, `K8sRunner` for `k8s.job_template_path`, None for
    neither (rollouts then wait in the store's queue for runners started elsewhere)."""
    if settings.agent_class:
        return LocalRunner(
            settings.agent_class,
            settings.env_map,
            settings.rollout_timeout_seconds,
            use_ray=settings.local_use_ray,
        )
    if settings.job_template_path:
        from .k8s import K8sRunner, KubeClient

        return K8sRunner(
            Path(settings.job_template_path).read_text(encoding="utf-8"),
            KubeClient.from_environment(namespace=settings.k8s_namespace),
            env_map=settings.env_map,
            timeout_s=settings.rollout_timeout_seconds,
        )
    return None
