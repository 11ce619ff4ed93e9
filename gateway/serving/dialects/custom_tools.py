"""Responses' custom (freeform) tools as chat function tools, and their calls back as custom items.

Codex declares some tools as ``{"type": "custom", "name", "description", "format"}``: the model's call
carries free text (``input``: a patch, a script), not JSON arguments. Chat templates and engines know
only function tools, so a custom tool goes to the engine as a function with one string parameter,
``input`` (its description followed by the grammar its input follows, when it names one), and a call
of it comes back as a ``custom_tool_call`` item whose ``input`` is that string; the agent's replayed
``custom_tool_call`` and ``custom_tool_call_output`` items go back as the function call and its
result. The same text every turn, so the prompt prefix the engine caches does not change. An engine
with its own Responses API (vLLM) gets custom tools as they are, except a grammar: it goes into the
description there too (:func:`grammars_described`).
"""

from __future__ import annotations

import json
from typing import Any

PARAMETER = "input"


def _description(tool: dict[str, Any]) -> str:
    """A custom tool's description, followed by the grammar its input follows when it names one."""
    description = str(tool.get("description") or "")
    form = tool.get("format")
    if isinstance(form, dict) and form.get("type") == "grammar" and form.get("definition"):
        syntax = form.get("syntax") or "grammar"
        description += f"\n\nThe `{PARAMETER}` string follows this {syntax} grammar:\n{form['definition']}"
    return description.strip()


def as_function(tool: dict[str, Any]) -> dict[str, Any]:
    """The chat function tool standing for a custom tool."""
    description = _description(tool)
    parameters = {
        "type": "object",
        "properties": {PARAMETER: {"type": "string", "description": "The tool's free-form input."}},
        "required": [PARAMETER],
        "additionalProperties": False,
    }
    function = {"name": tool.get("name", ""), "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def grammars_described(tools: Any) -> list[str]:
    """Custom tools whose input follows a grammar made free-form, the grammar in their description, in
    place, for an engine's own Responses API: vLLM 0.32 refuses them with a 400 ("only free-form text
    custom tools are accepted"), and Codex declares apply_patch with its Lark grammar. vLLM shows a
    custom tool to the model as a function with one string ``input`` and the tool's description, so
    the model reads what the translated route gives it (:func:`as_function`). The names changed."""
    changed: list[str] = []
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            changed += grammars_described(tool.get("tools"))
            continue
        form = tool.get("format")
        if tool.get("type") == "custom" and isinstance(form, dict) and form.get("type") == "grammar":
            tools[index] = {**tool, "description": _description(tool), "format": {"type": "text"}}
            changed.append(str(tool.get("name", "")))
    return changed


def names(tools: Any) -> set[str]:
    """The names of the custom tools a request declares (namespaces included)."""
    found: set[str] = set()
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "custom":
            found.add(str(tool.get("name", "")))
        elif tool.get("type") == "namespace":
            found |= names([{**inner, "type": inner.get("type", "function")} for inner in tool.get("tools", [])])
    return found


def input_of(arguments: str) -> str:
    """The free text of a call's JSON arguments: ``input``, else an object's one string value, else the
    arguments as they came (a small model may answer with the text itself)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict):
        if isinstance(parsed.get(PARAMETER), str):
            return str(parsed[PARAMETER])
        strings = [value for value in parsed.values() if isinstance(value, str)]
        if len(parsed) == 1 and strings:
            return strings[0]
    return parsed if isinstance(parsed, str) else arguments


def arguments_of(text: Any) -> str:
    """A replayed custom call's input as the function arguments the engine saw it produce."""
    return json.dumps({PARAMETER: text if isinstance(text, str) else json.dumps(text)}, ensure_ascii=False)


def call_item(item_id: str, call_id: str, name: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A Responses ``custom_tool_call`` output item."""
    item = {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name, "input": text}
    return item | {"status": status}
