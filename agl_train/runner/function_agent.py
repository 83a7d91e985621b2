"""An agent written as a function: `package.module:function(task) -> reward`.

`agl train` runs it through the launcher like any agent class: `FunctionAgent().run()` loads the
function `AGL_AGENT_FUNCTION` names and calls it with the rollout's task (`AGL_INPUT`); what it
returns (or awaits to) is the reward, as for `run()`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .launch import load_agent_class

FUNCTION_ENV = "AGL_AGENT_FUNCTION"
AGENT_CLASS = "agl_train.runner.function_agent:FunctionAgent"


class FunctionAgent:
    """Runs the function `AGL_AGENT_FUNCTION` names on the task."""

    def run(self) -> Any:
        function = load_agent_class(os.environ[FUNCTION_ENV])
        return function(json.loads(os.environ["AGL_INPUT"]))
