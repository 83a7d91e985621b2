"""The Responses API's tools as chat functions, and the model's calls back as the API's items.

Function tools are functions; a `namespace` tool's functions and custom tools are functions
named by their own name (`namespace__name` when that name is taken); a `custom` (freeform)
tool is a function of one string parameter `input`; `local_shell` is a function whose
arguments are its call's `action`. Hosted tools (`web_search`, `file_search`, ...) run on
OpenAI's servers, not in the client, so the model is not shown them: `ToolMap.left_out`
names them, the span records them (`agl.tools_left_out`) and the answer says so in its
`x-agl-tools-left-out` header. `ToolMap` is built from the client's request on the way in
and again on the way out, so the proxy keeps no state between the two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .base import expect, json_arguments, refuse

HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer_use",
        "mcp",
        "tool_search",
    }
)
"""Tool types OpenAI's servers run (the client does not): left out of what the model sees."""

CUSTOM_INPUT = "input"
"""The one string parameter of a custom (freeform) tool's function."""

LOCAL_SHELL = "local_shell"
_LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
        "working_directory": {"type": "string", "description": "The directory to run the command in."},
        "timeout_ms": {"type": "integer", "description": "How long the command may run, in milliseconds."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment variables."},
    },
    "required": ["command"],
}


@dataclass(frozen=True)
class ClientTool:
    """What one function the model sees is to the client."""

    kind: str
    """`function`, `custom` or `local_shell`."""
    name: str
    namespace: str | None = None


@dataclass
class ToolMap:
    """The functions the model sees for a request's tools, and what each is to the client."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    by_function: dict[str, ClientTool] = field(default_factory=dict)
    by_client: dict[tuple[str | None, str], str] = field(default_factory=dict)
    """(namespace, name) → the function's name."""
    left_out: list[str] = field(default_factory=list)
    top_level: set[str] = field(default_factory=set)
    """The names of the tools outside namespaces: a namespace's tool of such a name is qualified."""

    def add(self, tool: ClientTool, function: dict[str, Any]) -> None:
        name = tool.name
        if tool.namespace is not None and (name in self.by_function or name in self.top_level):
            name = f"{tool.namespace}__{tool.name}"
        if name in self.by_function:
            raise refuse("tools", f"two tools are named {name!r:.80}")
        self.functions.append({"type": "function", "function": {**function, "name": name}})
        self.by_function[name] = tool
        self.by_client[(tool.namespace, tool.name)] = name

    def function_name(self, name: str, namespace: str | None = None) -> str:
        """The model's name for a client tool seen in history (its own name when the request lacks it)."""
        return self.by_client.get((namespace, name), name)

    def output_item(self, base: str, index: int, call_id: Any, name: Any, arguments: str) -> dict[str, Any]:
        """The API's output item for the model's call of function `name`."""
        tool = self.by_function.get(name) if isinstance(name, str) else None
        common = {"id": f"fc_{base}_{index}", "call_id": call_id, "status": "completed"}
        if tool is None or tool.kind == "function":
            item = {"type": "function_call", **common, "name": tool.name if tool else name, "arguments": arguments}
        elif tool.kind == "custom":
            item = {"type": "custom_tool_call", **common, "name": tool.name, "input": custom_input(arguments)}
        else:
            action = {"command": [], **json_arguments(arguments), "type": "exec"}
            return {"type": "local_shell_call", **common, "id": f"lsh_{base}_{index}", "action": action}
        if tool is not None and tool.namespace is not None:
            item["namespace"] = tool.namespace
        return item


def custom_input(arguments: str) -> str:
    """A custom tool call's input from its function's arguments (the raw arguments when not `{"input": str}`)."""
    value = json_arguments(arguments).get(CUSTOM_INPUT)
    return value if isinstance(value, str) else arguments


def custom_arguments(text: str) -> str:
    """A custom tool call's input as its function's arguments."""
    return json.dumps({CUSTOM_INPUT: text})


def tool_map(tools: Any) -> ToolMap:
    """The `ToolMap` of a request's `tools` (None or absent: no tools); BadRequestError names a bad one."""
    out = ToolMap()
    if tools is None:
        return out
    tools = expect(tools, list, "tools", "a list")
    out.top_level = {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}
    for i, tool in enumerate(tools):
        _add(out, expect(tool, dict, f"tools[{i}]", "an object"), f"tools[{i}]", None)
    return out


def _add(out: ToolMap, tool: dict[str, Any], where: str, namespace: str | None) -> None:
    kind = expect(tool.get("type"), str, where + ".type", "a string")
    if kind == "function":
        name = expect(tool.get("name"), str, where + ".name", "a string")
        function: dict[str, Any] = {
            k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None
        }
        out.add(ClientTool("function", name, namespace), function)
    elif kind == "custom":
        name = expect(tool.get("name"), str, where + ".name", "a string")
        out.add(ClientTool("custom", name, namespace), _custom_function(tool, where))
    elif kind == "namespace" and namespace is None:
        inner = expect(tool.get("name"), str, where + ".name", "a string")
        for j, each in enumerate(expect(tool.get("tools"), list, where + ".tools", "a list")):
            _add(out, expect(each, dict, f"{where}.tools[{j}]", "an object"), f"{where}.tools[{j}]", inner)
    elif kind == LOCAL_SHELL and namespace is None:
        description = "Runs a shell command on the user's machine and returns its output."
        out.add(
            ClientTool(LOCAL_SHELL, LOCAL_SHELL), {"description": description, "parameters": _LOCAL_SHELL_PARAMETERS}
        )
    elif kind in HOSTED_TOOLS and namespace is None:
        out.left_out.append(str(kind))
    else:
        raise refuse(where + ".type", f"{kind!r:.50} tools are not supported")


def _custom_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    description = expect(tool.get("description") or "", str, where + ".description", "a string")
    fmt = tool.get("format")
    what = "The tool's input, free text."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        # The model cannot be held to the grammar through chat functions: it is shown it instead.
        syntax = expect(fmt.get("syntax", "lark"), str, where + ".format.syntax", "a string")
        definition = expect(fmt.get("definition"), str, where + ".format.definition", "a string")
        what = f"The tool's input, in this {syntax} grammar:\n{definition}"
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise refuse(where + ".format.type", f"must be text or grammar, got {fmt!r:.50}")
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": what}},
        "required": [CUSTOM_INPUT],
    }
    return {"description": description, "parameters": parameters}
