"""The PromQL of a dashboard's JSON, and Grafana's variables filled in, to run it elsewhere.

Works on the committed JSON (plain ``dict`` data), without the SDK, so tests that run every
panel's query against a real Prometheus can use it::

    data = json.loads(Path("dashboards/json/minder-job.json").read_text())
    values = {**default_variables(data), "job_id": "job-a", "machine": "node-003"}
    for title, expr in panel_queries(data):
        promql = substitute(expr, values)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

BUILTIN_VARIABLES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
"""Values for Grafana's global variables (override them through ``substitute``'s mapping)."""

_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::(?P<format>[\w]+))?\}|\$(?P<plain>\w+)|\[\[(?P<old>\w+)\]\]"
)
"""``${name}``, ``${name:format}``, ``$name`` and the deprecated ``[[name]]``."""


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of the dashboard, rows included, and the panels inside collapsed rows."""
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every non-hidden PromQL target of every panel, in order."""
    result: list[tuple[str, str]] = []
    for panel in iter_panels(dashboard):
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip() and not target.get("hide"):
                result.append((str(panel.get("title", "")), expr))
    return result


def annotation_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(annotation name, expr)`` of the dashboard's Prometheus annotation queries."""
    annotations = (dashboard.get("annotations") or {}).get("list") or []
    return [
        (str(a.get("name", "")), a["expr"])
        for a in annotations
        if isinstance(a.get("expr"), str) and a["expr"].strip()
    ]


def variable_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(variable name, query)`` of the dashboard's query variables (``label_values(...)``)."""
    result = []
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        raw = variable.get("query")
        text = raw.get("query") if isinstance(raw, dict) else raw
        if isinstance(text, str) and text.strip():
            result.append((str(variable["name"]), text))
    return result


_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\s*\)\s*$")


def variable_selector(query: str) -> str | None:
    """The series selector of a ``label_values(selector, label)`` query (None when it has none).

    ``label_values`` is Grafana's, not PromQL; its selector is PromQL and can be checked alone.
    """
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values(...) query: {query!r}")
    return match.group("selector")


def variable_options(dashboard: Mapping[str, Any]) -> dict[str, list[str]]:
    """The fixed values of every custom variable, by name."""
    result = {}
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "custom":
            result[str(variable["name"])] = [str(o["value"]) for o in variable.get("options", [])]
    return result


def default_variables(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """The value each custom, textbox and constant variable starts with, by name.

    Query variables (``job_id``, ``machine``) have no default: their values come from live data,
    so the caller supplies them.
    """
    result: dict[str, str] = {}
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        kind = variable.get("type")
        if kind not in {"custom", "textbox", "constant"}:
            continue
        current = variable.get("current") or {}
        value = current.get("value")
        if not isinstance(value, str):
            options = variable.get("options") or []
            value = options[0]["value"] if options else variable.get("query", "")
        result[str(variable["name"])] = str(value)
    return result


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """``expr`` with Grafana's variables replaced by ``variables`` (and Grafana's globals).

    ``$__rate_interval``, ``$__interval`` and ``$__range`` default to ``BUILTIN_VARIABLES``
    unless ``variables`` names them. A variable that is neither raises ``KeyError`` naming it,
    so a query never reaches Prometheus with a ``$`` left in it.
    """
    values = {**BUILTIN_VARIABLES, **variables}

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain") or match.group("old")
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def variable_names(expr: str) -> set[str]:
    """The Grafana variables ``expr`` uses (globals such as ``__rate_interval`` included)."""
    return {
        m.group("braced") or m.group("plain") or m.group("old") for m in _VARIABLE.finditer(expr)
    }
