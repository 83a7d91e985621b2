"""Anthropic's tools as chat functions, and the blocks that turn into plain text.

Custom tools are functions with their `input_schema`. Anthropic-defined client tools (`bash_*`,
`text_editor_*`, `computer_*`, `memory_*`) run in the client too: they are functions with the
input schema Anthropic publishes for them. Server tools (`web_search_*`, `web_fetch_*`,
`code_execution_*`, `tool_search_tool_*`) run on Anthropic's servers, so the model is not
shown them (`ChatTools.left_out`, the span's `agl.tools_left_out`), nor their blocks in history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import expect, refuse

SERVER_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")
"""Type prefixes of the tools Anthropic's servers run."""


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STRING = {"type": "string"}
_EDITOR = {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
    "path": {"type": "string", "description": "Absolute path to the file or directory."},
    "file_text": {"type": "string", "description": "With `create`: the file's content."},
    "old_str": {"type": "string", "description": "With `str_replace`: the text to replace, exactly once in the file."},
    "new_str": {
        "type": "string",
        "description": "With `str_replace`: the new text; with `insert`: the text to insert.",
    },
    "insert_line": {"type": "integer", "description": "With `insert`: the line after which to insert."},
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "With `view`: [first, last] line."},
}
# The published input schemas of Anthropic's client tools, by type prefix.
CLIENT_TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "bash_": (
        "Runs a command in a persistent bash shell.",
        _object(
            {
                "command": {"type": "string", "description": "The bash command to run."},
                "restart": {"type": "boolean", "description": "Restart the shell."},
            },
            [],
        ),
    ),
    "text_editor_": ("Views, creates and edits files.", _object(_EDITOR, ["command", "path"])),
    "computer_": (
        "Uses the computer's mouse, keyboard and screen.",
        _object(
            {
                "action": _STRING,
                "coordinate": {"type": "array", "items": {"type": "integer"}},
                "text": _STRING,
                "scroll_direction": _STRING,
                "scroll_amount": {"type": "integer"},
                "duration": {"type": "number"},
                "key": _STRING,
            },
            ["action"],
        ),
    ),
    "memory_": (
        "Reads and writes files in the /memories directory.",
        _object(
            {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
                "path": _STRING,
                "file_text": _STRING,
                "old_str": _STRING,
                "new_str": _STRING,
                "insert_line": {"type": "integer"},
                "insert_text": _STRING,
                "old_path": _STRING,
                "new_path": _STRING,
                "view_range": {"type": "array", "items": {"type": "integer"}},
            },
            ["command"],
        ),
    ),
}


@dataclass
class ChatTools:
    functions: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def chat_tools(tools: Any) -> ChatTools:
    """The chat functions of a Messages request's `tools`; BadRequestError names a tool it cannot map."""
    out = ChatTools()
    if tools is None:
        return out
    for i, tool in enumerate(expect(tools, list, "tools", "a list")):
        where = f"tools[{i}]"
        tool = expect(tool, dict, where, "an object")
        kind = tool.get("type")
        if kind is not None:
            expect(kind, str, where + ".type", "a string")
        if kind is not None and kind.startswith(SERVER_TOOL_PREFIXES):
            out.left_out.append(kind)
            continue
        function = {"name": expect(tool.get("name"), str, where + ".name", "a string")}
        if kind in (None, "custom"):
            if tool.get("description") is not None:
                function["description"] = expect(tool["description"], str, where + ".description", "a string")
            function["parameters"] = expect(tool.get("input_schema"), dict, where + ".input_schema", "an object")
        else:
            known = next((v for prefix, v in CLIENT_TOOL_SCHEMAS.items() if kind.startswith(prefix)), None)
            if known is None:
                raise refuse(where + ".type", f"{kind!r:.50} tools are not supported")
            function["description"], function["parameters"] = known
        out.functions.append({"type": "function", "function": function})
    return out


def is_server_block(kind: Any) -> bool:
    """Whether a content block records a server tool's use or result (not shown to the model)."""
    return isinstance(kind, str) and (
        kind in ("server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload")
        or (kind.endswith("_tool_result") and kind != "tool_result")
    )


def block_text(block: dict[str, Any], where: str) -> str | None:
    """The text of a `text`, `document` or `search_result` block; None for other blocks.

    A document whose source is not text (a PDF, a file id) is a BadRequestError naming it.
    """
    kind = block.get("type")
    if kind == "text":
        return str(expect(block.get("text"), str, where + ".text", "a string"))
    if kind == "search_result":
        content = expect(block.get("content"), list, where + ".content", "a list of text blocks")
        texts = [_text_of(each, f"{where}.content[{k}]") for k, each in enumerate(content)]
        head = [str(block[key]) for key in ("title", "source") if isinstance(block.get(key), str)]
        return "\n".join([*head, *texts])
    if kind != "document":
        return None
    source = expect(block.get("source"), dict, where + ".source", "an object")
    kind = source.get("type")
    if kind == "text":
        text = str(expect(source.get("data"), str, where + ".source.data", "a string"))
    elif kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            text = content
        else:
            parts = expect(content, list, where + ".source.content", "a string or a list of text blocks")
            text = "\n".join(_text_of(each, f"{where}.source.content[{k}]") for k, each in enumerate(parts))
    else:
        raise refuse(
            where + ".source.type",
            f"{kind!r:.50} documents cannot be turned into text for the model; send text or content sources",
        )
    title = block.get("title")
    return f"{title}\n\n{text}" if isinstance(title, str) and title else text


def _text_of(block: Any, where: str) -> str:
    block = expect(block, dict, where, "a text block")
    if block.get("type") != "text":
        raise refuse(where + ".type", f"must be text, got {block.get('type')!r:.50}")
    return str(expect(block.get("text"), str, where + ".text", "a string"))
