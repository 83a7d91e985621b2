"""A user's hooks module, as `agentlightning.hooks` names it."""

from __future__ import annotations

import os


class RolloutHooks:
    def on_startup(self) -> None:
        os.environ["AGL_TEST_HOOK_RAN"] = "yes"
