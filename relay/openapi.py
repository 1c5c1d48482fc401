"""The OpenAPI 3.1 document of the relay, generated from the route table and the msgspec
types of `replica.wire`, so the document cannot drift from what the handlers decode."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from replica.wire import PROTOCOL_VERSION, ErrorBody

if TYPE_CHECKING:
    from relay.app import Endpoint

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "malformed body",
    "401": "missing, malformed, unknown, expired or revoked token",
    "403": "no valid invite, or not the current auth key",
    "404": "not found",
    "409": "the name is taken, or the key bundle changed (compare-and-set lost)",
    "413": "too large",
    "415": "unsupported media type",
    "422": "invalid value",
    "429": "rate limited (Retry-After)",
}


def openapi_document(
    endpoints: Iterable[Endpoint], query_bounds: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """The document; `query_bounds` gives each query integer's inclusive range."""
    endpoints = list(endpoints)
    types = [ErrorBody] + [t for e in endpoints for t in (e.body, e.answer) if t is not None]
    _, components = msgspec.json.schema_components(types, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation = _operation(endpoint, query_bounds)
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "sealsync relay", "version": str(PROTOCOL_VERSION)},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(endpoint: Endpoint, query_bounds: dict[str, tuple[int, int]]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": endpoint.handler.__name__,
        "summary": endpoint.summary,
        "responses": _responses(endpoint),
    }
    parameters = _parameters(endpoint, query_bounds)
    if parameters:
        operation["parameters"] = parameters
    if endpoint.body is not None:
        schema = {"$ref": _REF.format(name=endpoint.body.__name__)}
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    if endpoint.auth:
        operation["security"] = [{"bearer": []}]
    return operation


def _parameters(
    endpoint: Endpoint, query_bounds: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    """The path's names (strings) and the query's integers, each with its inclusive range."""
    in_path = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    in_query = [
        {
            "name": name,
            "in": "query",
            "required": False,
            "schema": {
                "type": "integer",
                "minimum": query_bounds[name][0],
                "maximum": query_bounds[name][1],
            },
        }
        for name in endpoint.query
    ]
    return in_path + in_query


def _responses(endpoint: Endpoint) -> dict[str, Any]:
    error = {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}}
    responses: dict[str, Any] = {
        code: {"description": text, "content": error} for code, text in _ERRORS.items()
    }
    ok: dict[str, Any] = {"description": endpoint.summary}
    if endpoint.answer is not None:
        schema = {"$ref": _REF.format(name=endpoint.answer.__name__)}
        ok["content"] = {"application/json": {"schema": schema}}
    elif endpoint.path == "/v1/events":
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    responses[str(endpoint.status)] = ok
    return responses
