"""`k8s` rollout execution: one Kubernetes Job per rollout, from a Jinja template.

The template (`agentlightning.k8s.job_template_path`) is rendered per rollout with these
names in scope: `input` (the rollout's input), `rollout_id`, `attempt_id`, `job_name`,
`base_url` (the rollout's proxy URL), `model`, `agl_key`, `store_url`, `timeout_seconds` and
`env` (the `env_map` variables plus agl's, as a dict). The `yaml_escape` filter turns any
value into a double-quoted YAML scalar, so task text with quotes, colons, newlines or any
unicode cannot break the manifest:

```yaml
env:
{% for name, value in env.items() %}
  - {name: {{ name | yaml_escape }}, value: {{ value | yaml_escape }}}
{% endfor %}
```

The rendered manifest must parse as a `batch/v1` Job. It is created through the Kubernetes
REST API (httpx; in-cluster service account or kubeconfig), watched until it ends, and
deleted; past the rollout timeout it is deleted and the rollout marked failed (attempt
`timeout`). The reward is read from the pod's log (the launcher's `AGL_RESULT` line), or the
agent writes an `agl.reward` span to the store itself (`AGL_STORE_URL`).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import jinja2
import yaml

from agl_store.models import AttemptedRollout

from .env import MissingInputField, RolloutEndpoints, env_value, parse_result, rollout_env
from .outcome import RolloutOutcome

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLL_S = 2.0
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}


def _printable(code: int) -> bool:
    # YAML 1.1/1.2 printable set, minus the characters YAML reads as line breaks (NEL, LS, PS).
    return (
        code in (0x09, 0x0A, 0x0D)
        or 0x20 <= code <= 0x7E
        or 0xA0 <= code <= 0xD7FF
        or (0xE000 <= code <= 0xFFFD and code != 0xFEFF)
        or 0x10000 <= code <= 0x10FFFF
    ) and code not in (0x2028, 0x2029)


def yaml_escape(value: Any) -> str:
    """`value` as a double-quoted YAML scalar that loads back to exactly `str(value)`.

    Strings are taken as they are; other values as JSON (`env.env_value`). Backslash, quote
    and every character YAML would not keep literally are escaped.
    """
    text = value if isinstance(value, str) else env_value(value)
    out = []
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif not _printable(code):
            out.append(f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def template_environment() -> jinja2.Environment:
    """Jinja with strict undefined names (a typo fails the rollout, not the cluster) and `yaml_escape`."""
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    environment.filters["yaml_escape"] = yaml_escape
    return environment


def job_name_for(rollout_id: str, attempt_id: str) -> str:
    """A DNS-1123 Job name from the ids (lowercase, `-`, at most 63 characters)."""
    raw = f"agl-{rollout_id}-{attempt_id}".lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw)[:63].rstrip("-")


def render_job(template: str | jinja2.Template, context: Mapping[str, Any]) -> dict[str, Any]:
    """Render the Job manifest of one rollout and check that it is a `batch/v1` Job.

    `metadata.name` defaults to `context["job_name"]`; `spec.backoffLimit` to 0 (one attempt
    is one pod: retries are the store's business). Raises ValueError for a template that does
    not render to a Job (jinja2's own errors for undefined names).
    """
    compiled = template_environment().from_string(template) if isinstance(template, str) else template
    text = compiled.render(**context)
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"the Job template rendered invalid YAML: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ValueError(f"the Job template must render one YAML mapping, got {type(manifest).__name__}")
    if manifest.get("apiVersion") != "batch/v1" or manifest.get("kind") != "Job":
        raise ValueError(
            f"the Job template must render apiVersion: batch/v1, kind: Job; got {manifest.get('apiVersion')!r}, "
            f"{manifest.get('kind')!r}"
        )
    metadata = manifest.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError("the Job's metadata must be a mapping")
    if "job_name" in context:
        metadata.setdefault("name", context["job_name"])
    if not metadata.get("name"):
        raise ValueError("the Job has no metadata.name")
    spec = manifest.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
        raise ValueError("the Job needs spec.template (the pod template)")
    spec.setdefault("backoffLimit", 0)
    return manifest


class KubeError(RuntimeError):
    """The Kubernetes API answered with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"Kubernetes API error {status_code}: {message}")
        self.status_code = status_code


class KubeClient:
    """The few Kubernetes API calls a rollout needs (Jobs and their pods' logs), over httpx.

    `KubeClient.from_environment()` uses the in-cluster service account when it runs in a
    pod, else the current context of `$KUBECONFIG` / `~/.kube/config` (bearer token and CA).
    """

    def __init__(
        self,
        server: str,
        *,
        namespace: str = "default",
        token: str | None = None,
        verify: bool | str | ssl.SSLContext = True,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.namespace = namespace
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=self.server, headers=headers, verify=verify, timeout=timeout_s, transport=transport
        )

    @classmethod
    def from_environment(cls, namespace: str | None = None) -> KubeClient:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token_file = SERVICE_ACCOUNT_DIR / "token"
        if host and token_file.exists():
            ns_file = SERVICE_ACCOUNT_DIR / "namespace"
            default_ns = ns_file.read_text().strip() if ns_file.exists() else "default"
            return cls(
                f"https://{host}:{port}",
                namespace=namespace or default_ns,
                token=token_file.read_text().strip(),
                verify=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
            )
        path = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
        return cls.from_kubeconfig(path, namespace=namespace)

    @classmethod
    def from_kubeconfig(cls, path: Path, namespace: str | None = None) -> KubeClient:
        """The current context of a kubeconfig file (token auth; CA file or data)."""
        if not path.exists():
            raise FileNotFoundError(f"no in-cluster service account and no kubeconfig at {path}")
        config = yaml.safe_load(path.read_text()) or {}
        by_name = lambda kind: {item["name"]: item.get(kind[:-1], {}) for item in config.get(kind, [])}  # noqa: E731
        context = by_name("contexts").get(config.get("current-context"), {})
        cluster = by_name("clusters").get(context.get("cluster"), {})
        user = by_name("users").get(context.get("user"), {})
        if "server" not in cluster:
            raise ValueError(f"kubeconfig {path}: the current context names no cluster server")
        verify: bool | str = True
        if cluster.get("insecure-skip-tls-verify"):
            verify = False
        elif cluster.get("certificate-authority"):
            verify = cluster["certificate-authority"]
        elif cluster.get("certificate-authority-data"):
            handle = tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False)
            handle.write(base64.b64decode(cluster["certificate-authority-data"]))
            handle.close()
            verify = handle.name
        return cls(
            cluster["server"],
            namespace=namespace or context.get("namespace") or "default",
            token=user.get("token"),
            verify=verify,
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text[:500])
        return response

    def _jobs(self, namespace: str | None) -> str:
        return f"/apis/batch/v1/namespaces/{namespace or self.namespace}/jobs"

    async def create_job(self, manifest: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return (await self._call("POST", self._jobs(namespace), json=dict(manifest))).json()

    async def get_job(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return (await self._call("GET", f"{self._jobs(namespace)}/{name}")).json()

    async def delete_job(self, name: str, namespace: str | None = None) -> None:
        """Delete the Job and (in the background) its pods; a Job already gone is fine."""
        try:
            await self._call("DELETE", f"{self._jobs(namespace)}/{name}", json={"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status_code != 404:
                raise

    async def job_logs(self, name: str, namespace: str | None = None) -> str:
        """The log of the Job's newest pod ('' when it has none)."""
        ns = namespace or self.namespace
        pods = (
            await self._call("GET", f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"job-name={name}"})
        ).json()
        items = sorted(pods.get("items", []), key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""))
        if not items:
            return ""
        pod = items[-1]["metadata"]["name"]
        return (await self._call("GET", f"/api/v1/namespaces/{ns}/pods/{pod}/log")).text

    async def aclose(self) -> None:
        await self._http.aclose()


def job_state(job: Mapping[str, Any]) -> str | None:
    """`succeeded` / `failed` once the Job has ended (by its conditions or pod counts), else None."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return "succeeded" if condition["type"] == "Complete" else "failed"
    if status.get("succeeded"):
        return "succeeded"
    if status.get("failed"):
        return "failed"
    return None


class K8sRunner:
    """Runs each rollout as a Kubernetes Job rendered from `template`."""

    def __init__(
        self,
        template: str,
        client: KubeClient,
        *,
        env_map: Mapping[str, str],
        timeout_s: float,
        poll_s: float = POLL_S,
        delete_finished: bool = True,
    ) -> None:
        self.template = template_environment().from_string(template)
        self.client = client
        self.env_map = dict(env_map)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.delete_finished = delete_finished

    def context(self, rollout: AttemptedRollout, endpoints: RolloutEndpoints) -> dict[str, Any]:
        """The names a template sees for this rollout (see the module docstring)."""
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        return {
            "input": rollout.input,
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "job_name": job_name_for(rollout_id, attempt_id),
            "base_url": endpoints.base_url,
            "model": endpoints.model,
            "agl_key": endpoints.key,
            "store_url": endpoints.store_url or "",
            "timeout_seconds": self.timeout_s,
            "env": rollout_env(rollout_id, attempt_id, rollout.input, self.env_map, endpoints),
        }

    async def run(self, rollout: AttemptedRollout, endpoints: RolloutEndpoints) -> RolloutOutcome:
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        try:
            manifest = render_job(self.template, self.context(rollout, endpoints))
        except (MissingInputField, ValueError, jinja2.TemplateError) as exc:
            return RolloutOutcome(rollout_id, attempt_id, "failed", message=f"Job template: {exc}")
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"].get("namespace")
        try:
            await self.client.create_job(manifest, namespace)
        except (KubeError, httpx.HTTPError) as exc:
            return RolloutOutcome(rollout_id, attempt_id, "failed", message=f"creating Job {name}: {exc}")
        try:
            state = await asyncio.wait_for(self._wait(name, namespace), self.timeout_s)
        except TimeoutError:
            await self.client.delete_job(name, namespace)
            message = f"Job {name} deleted after the rollout timeout of {self.timeout_s:g} s"
            return RolloutOutcome(rollout_id, attempt_id, "timeout", message=message)
        except asyncio.CancelledError:
            await self.client.delete_job(name, namespace)
            raise
        logs = await self._logs(name, namespace)
        if self.delete_finished:
            await self.client.delete_job(name, namespace)
        if state == "failed":
            return RolloutOutcome(rollout_id, attempt_id, "failed", message=f"Job {name} failed\n{logs}")
        payload = parse_result(logs)
        reward = None if payload is None else payload.get("reward")
        return RolloutOutcome(rollout_id, attempt_id, "succeeded", reward=reward)

    async def _wait(self, name: str, namespace: str | None) -> str:
        while True:
            try:
                state = job_state(await self.client.get_job(name, namespace))
            except (KubeError, httpx.HTTPError):
                state = None  # a flaky API server: keep watching until the timeout
            if state is not None:
                return state
            await asyncio.sleep(self.poll_s)

    async def _logs(self, name: str, namespace: str | None) -> str:
        try:
            return await self.client.job_logs(name, namespace)
        except (KubeError, httpx.HTTPError) as exc:
            return f"(no log: {exc})"
