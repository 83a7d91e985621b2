"""The agent of the codex-words task: an unmodified Codex CLI, rewarded on its final message.

Each rollout runs `codex exec "<task>"` (Codex CLI 0.169.0 from `.cache/codex`, installed by
scripts/setup.sh) non-interactively in a fresh temporary working directory, with its own
`CODEX_HOME` whose `config.toml` points Codex's model provider at the rollout's base URL
(`AGL_BASE_URL`, agl's proxy; `wire_api = "responses"`). Codex sends its own model name, its
instructions and tools (a prompt of ~24k tokens with the tiny model's vocabulary); the proxy
serves it from vLLM and records every call with its token ids. The reward is the share of the
final message's tokens (`--output-last-message`, encoded again with the model's tokenizer) that
are lowercase words, the lowercase-words example's measure (`lowercase_share`).

The task (`AGL_INPUT`) is `{"prompt": str, "tokenizer": path of the model's tokenizer.json}`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from examples.lowercase_words.agent import lowercase_share

REPO = Path(__file__).resolve().parents[2]
CODEX = REPO / ".cache" / "codex" / "node_modules" / ".bin" / "codex"
CODEX_TIMEOUT_S = 500.0
# Codex retries a failed request itself; a call refused while the proxy is paused for a weight
# update (429) is waited out by those retries rather than failing the rollout.
REQUEST_RETRIES = 4


def codex_config(base_url: str, retries: int = REQUEST_RETRIES) -> str:
    """What a user writes in ~/.codex/config.toml to run Codex on their own model server."""
    return f"""model = "gpt-5.1-codex"
model_provider = "agl"

[model_providers.agl]
name = "agl"
base_url = "{base_url}"
wire_api = "responses"
request_max_retries = {retries}
stream_max_retries = {retries}
"""


def token_texts(text: str, tokenizer_path: Path) -> list[str]:
    """`text` as the model's tokens (each decoded on its own), with `tokenizers` alone (no transformers import)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    return [tokenizer.decode([token_id]) for token_id in tokenizer.encode(text, add_special_tokens=False).ids]


def message_reward(message: str, tokenizer_path: Path) -> float:
    """The reward of a final message: the share of its tokens that are lowercase words (0.0 when empty)."""
    return lowercase_share(token_texts(message, tokenizer_path))


def run_codex(prompt: str, base_url: str, root: Path) -> str:
    """`codex exec prompt` in `root/work` with its home in `root`; returns its last message.
    A Codex that fails raises RuntimeError with the tail of its output."""
    home, work, last = root / "codex-home", root / "work", root / "last-message.txt"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(base_url))
    command = [
        str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
        "--output-last-message", str(last), prompt,
    ]  # fmt: skip
    env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(root)}
    done = subprocess.run(
        command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=CODEX_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"codex exec exited with {done.returncode}:\n{done.stdout.decode(errors='replace')[-3000:]}")
    return last.read_text() if last.exists() else ""


class CodexWordsAgent:
    """`run()` → the reward of one rollout: one `codex exec` of the task's prompt (`$PROMPT`)."""

    def run(self) -> float:
        with tempfile.TemporaryDirectory(prefix="codex-words-") as tmp:
            message = run_codex(os.environ["PROMPT"], os.environ["AGL_BASE_URL"], Path(tmp))
        return message_reward(message, Path(os.environ["TOKENIZER"]))
