"""Argument types that several tools share, with the descriptions clients see in tools/list (one wording,
so the same argument reads the same in every tool)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

Filters = Annotated[dict[str, Any] | None, Field(
    description="Only chunks matching every field: {\"content_type\": \"code_block\"}, {\"kind\": [\"note\", "
                "\"research\"]} (a list means any of). Fields: content_type, kind, node_type, status, tags, keywords, "
                "code_language, document, collection.")]
MaxTokens = Annotated[int | None, Field(description="Token budget: stop adding results once their content reaches "
                                                    "this many tokens (at least one result is returned).", ge=1)]
Snippets = Annotated[bool, Field(description="Return the most query-relevant excerpt of each chunk instead of the "
                                             "whole chunk.")]
CollectionName = Annotated[str, Field(description="Collection name: 3-512 characters of letters, digits, '.', "
                                                  "'_' or '-', starting and ending with a letter or digit.")]
TaskType = Literal["implement", "debug", "refactor", "document", "review", "design", "test"]
