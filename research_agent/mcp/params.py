"""Argument types that several tools share, with the descriptions clients see in tools/list (one wording,
so the same argument reads the same in every tool), and the shaping of the schemas tools/list carries.

Names follow DESIGN.md section 3 (the seed's specs); where tools disagreed without reason the other names are
accepted as validation aliases (`collection`/`collection_name`, `collections`/`scope`, `top_k`/`max_results`,
`project`/`project_name`): the schema shows one name, a caller using the other is still understood.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, Field, WithJsonSchema

from research_agent.catalog.common import DEFAULT_PAGE, MAX_PAGE
from research_agent.config import Settings

Filters = Annotated[dict[str, Any] | None, Field(
    description="{field: value, or a list: any of}; all must match. Fields: content_type, kind, node_type, "
                "status, tags, keywords, code_language, document, collection.")]
MaxTokens = Annotated[int | None, Field(description="Token budget for the results.", ge=1)]
Snippets = Annotated[bool, Field(description="Only each chunk's most relevant excerpt.")]
Limit = Annotated[int | None, Field(description=f"Page size (default {DEFAULT_PAGE}).", ge=1, le=MAX_PAGE)]
Cursor = Annotated[str | None, Field(description="A page's next_cursor.")]
#: The JSON-schema bound of a result count (top_k, max_results, k): the services refuse counts above the
#: max_top_k setting, 100 unless configured, and a schema without `maximum` let agents learn that only from a
#: failed call. Advertised, not validated here: the setting decides at call time (a store configured for more
#: still answers more; its schema then understates the bound, never overstates it).
COUNT_BOUND = {"maximum": Settings.model_fields["max_top_k"].default}
TaskType = Literal["implement", "debug", "refactor", "document", "review", "design", "test"]

#: The other names each seed argument name is accepted under (DESIGN.md section 3 names win).
ALIASES: dict[str, tuple[str, ...]] = {
    "collection": ("collection_name",),
    "collection_name": ("collection",),
    "collections": ("scope", "collection"),
    "scope": ("collections", "collection"),
    "top_k": ("max_results",),
    "max_results": ("top_k",),
    "project": ("project_name",),
    "project_name": ("project",),
}


def aliased(name: str) -> AliasChoices:
    """The argument's own name first (what the schema shows), then the names it is also accepted under."""
    return AliasChoices(name, *ALIASES.get(name, ()))


def split_names(value: Any) -> Any:
    """"a, b," and ["a", "b"] both mean ["a", "b"]: split on commas, trim, drop empties (the Research Agent spec
    sends a comma-separated string, JSON-minded agents an array). Anything else is left for pydantic to refuse."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return value


def names(name: str, description: str) -> Any:
    """A list of collection names accepted as "a,b" or an array (the schema advertises both), under `name` and
    its aliases. An empty result ([]) means "none given": tools treat it like an omitted argument."""
    schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
              "description": description}
    return Annotated[list[str] | None, BeforeValidator(split_names), WithJsonSchema(schema),
                     Field(validation_alias=aliased(name))]


CollectionName = Annotated[str, Field(description="Collection name.", validation_alias=aliased("collection"))]
ProjectScope = Annotated[str | None, Field(description="Search this project's default collections.",
                                           validation_alias=aliased("project"))]


# -- the schemas tools/list carries ------------------------------------------------------------------------
def lean_input(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as tools/list carries it, without what tells a client nothing; validation is pydantic's,
    unchanged, and `type`, `enum`, `anyOf`, `required`, bounds and non-trivial defaults all stay.

    - An optional argument is shown as its type alone: `anyOf [X, null]` + `default: null` become X (omitting
      it means the default; null is still accepted), also inside an object argument (ingest_documents'
      `records`): 40 arguments, 1,608 bytes (1,479 before issue 15 reached the nested fields).
    - A flag's `default: false` goes (omitting a flag means false to every client): 7 flags, 112 bytes.
    - `additionalProperties` goes: `true` is JSON Schema's default (`filters`), and the top level's `false`
      (fastmcp's forbid-extra model) was not even true of this server, which accepts the aliases (params.ALIASES)
      the schema does not list; an unknown argument is still refused with a -32602 naming it. 14 tools, 434 bytes.
    """
    props = {key: _lean_property(spec) for key, spec in (schema.get("properties") or {}).items()}
    lean = {**{k: v for k, v in schema.items() if k != "additionalProperties"}, "properties": props}
    if "$defs" in schema:  # an object argument's model, referenced until FastMCP dereferences it for tools/list
        lean["$defs"] = {name: lean_input(model) for name, model in schema["$defs"].items()}
    return lean


def _lean_property(spec: dict[str, Any]) -> dict[str, Any]:
    if "default" in spec and spec["default"] is None:
        alts = [a for a in spec.get("anyOf") or [] if a != {"type": "null"}]
        spec = {k: v for k, v in spec.items() if k not in ("anyOf", "default")}
        spec = {**alts[0], **spec} if len(alts) == 1 else {"anyOf": alts, **spec} if alts else spec
    drop = {"additionalProperties"} if spec.get("additionalProperties") is True else set()
    if spec.get("type") == "boolean" and spec.get("default") is False:
        drop.add("default")
    spec = {k: v for k, v in spec.items() if k not in drop}
    return lean_input(spec) if isinstance(spec.get("properties"), dict) else spec


def _lean(node: Any, depth: int) -> Any:
    """A result schema cut to what an agent navigates by: top-level field names and JSON types, nullable as a
    type list; nested objects stay `object` (their fields are in the description and docs/mcp.md)."""
    if isinstance(node, list):
        return [_lean(item, depth) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:  # a recursive model (a node's children) that dereferencing left as a reference
        return {"type": "object"}
    alts = node.get("anyOf")
    if alts and {"type": "null"} in alts and len(alts) == 2:
        inner = _lean(next(a for a in alts if a != {"type": "null"}), depth)
        kind = inner.get("type")
        return {**inner, "type": [kind, "null"]} if isinstance(kind, str) else {"anyOf": [inner, {"type": "null"}]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "description", "default", "examples") or (key == "additionalProperties" and value is True):
            continue
        if key in ("properties", "required", "additionalProperties") and depth >= 1:
            continue
        out[key] = ({k: _lean(v, depth + 1) for k, v in value.items()} if key == "properties"
                    else _lean(value, depth))
    if depth >= 1 and "properties" in node:
        out["type"] = "object"
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The lean JSON schema of what `model.model_dump(mode="json")` produces."""
    from fastmcp.utilities.json_schema import dereference_refs

    schema = dereference_refs(model.model_json_schema(mode="serialization"))
    schema.pop("$defs", None)
    return _lean(schema, 0)


def result_schema(*models: type[BaseModel], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool's output schema: its result model, or one of several (a combined tool answers per action)."""
    shapes = [model_schema(m) for m in models]
    if extra:
        for shape in shapes:
            shape["properties"] = {**shape.get("properties", {}), **extra}
    if len(shapes) == 1:
        return shapes[0]
    return {"type": "object", "anyOf": [{k: v for k, v in s.items() if k != "type"} for s in shapes]}
