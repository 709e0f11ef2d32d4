"""Collections: create, list, inspect and delete the knowledge collections.

Imports projects (linking on create, unlinking on delete) as a module, so a test hook that replaces
`projects.drop_collection_links` still reaches these calls; projects never imports this module, so the two
share `Deleted` and `now_iso` through catalog/common.py. Both names stay importable from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.catalog import projects
from research_agent.catalog.common import Deleted, now_iso, paginate
from research_agent.errors import CollectionError
from research_agent.storage.leases import check_no_reindex
from research_agent.storage.store import validate_name

if TYPE_CHECKING:
    from research_agent.container import Container

COLLECTION_TYPES = ("fundamental", "project-specific")


class CollectionInfo(BaseModel):
    name: str
    type: str
    description: str
    projects: list[str]
    embedding_model: str
    embedding_dimension: int | None
    document_count: int
    chunk_count: int
    created_at: str


class CollectionCreated(CollectionInfo):
    """ensure_collection's answer: the collection, whether this call created it, and what it did not change."""

    created: bool
    warnings: list[str] = []


class CollectionList(BaseModel):
    """One page of collections in name order (catalog/common.py `paginate`)."""

    collections: list[CollectionInfo]
    total: int
    next_cursor: str | None = None


def open_collection(c: Container, name: str, *, check_model: bool = True) -> Any:
    """The Chroma collection for `name`; a model mismatch is a CollectionError that says to reindex."""
    col = c.store.get_collection(name)
    built_with = (col.metadata or {}).get("embedding_model")
    if check_model and built_with and built_with != c.settings.embedding_model:
        raise CollectionError(
            f"Collection {name!r} was built with embedding model {built_with!r}, but {c.settings.embedding_model!r} "
            "is configured; reindex it first",
            guidance=f"Run `research-agent kb reindex --collection {name}` to re-embed it, or set "
            f"RESEARCH_AGENT_EMBEDDING_MODEL={built_with}.",
            collection=name,
        )
    return col


def _info(c: Container, col: Any, project_links: dict[str, list[str]]) -> CollectionInfo:
    meta = col.metadata or {}
    docs = c.store.registry_find("document", col.name)
    return CollectionInfo(
        name=col.name,
        type=meta.get("type", "project-specific"),
        description=meta.get("description", ""),
        projects=project_links.get(col.name, []),
        embedding_model=meta.get("embedding_model", ""),
        embedding_dimension=meta.get("embedding_dimension"),
        document_count=len(docs),
        chunk_count=sum(int(d.get("chunk_count", 0)) for d in docs.values()),
        created_at=meta.get("created_at", ""),
    )


def _project_links(c: Container) -> dict[str, list[str]]:
    links: dict[str, list[str]] = {}
    for rec in c.store.registry_find("project").values():
        for name in rec.get("collections", []):
            links.setdefault(name, []).append(rec["name"])
    return links


def _check_type(type: str) -> None:
    if type not in COLLECTION_TYPES:
        raise CollectionError(
            f"Unknown collection type {type!r}", guidance=f"Use one of: {', '.join(COLLECTION_TYPES)}."
        )


def create_collection(c: Container, name: str, type: str = "project-specific", description: str = "",
                      project: str | None = None) -> CollectionInfo:
    """Create an empty collection (and link it to `project` when given)."""
    # First, before any lookup: an invalid name (a lone surrogate from undecodable argv) reached a Chroma
    # where-clause through the records clean-up below and failed as "Unexpected failure" (exit 1).
    validate_name(name)
    _check_type(type)
    if project:
        projects.require_project(c, project)
    with c.store.write_lock():
        if not c.store.has_collection(name):  # (this restores a collection a reindex left under its backup name)
            # Records left by a delete killed midway would make the new collection skip every file as
            # "unchanged" (issue 11 item 6): a collection starts with none of them.
            c.store.registry_delete_collection(name)
            projects.drop_collection_links(c, name)
        c.store.create_collection(name, {
            "type": type,
            "description": description or "",
            "embedding_model": c.settings.embedding_model,
            "embedding_backend": c.settings.embedding_backend,
            "chunk_max_tokens": c.settings.chunk_max_tokens,
            "created_at": now_iso(),
        })
    if project:
        projects.link_collections(c, project, [name])
    return get_collection_info(c, name)


def ensure_collection(c: Container, name: str, type: str | None = None, description: str | None = None,
                      project: str | None = None, *, exist_ok: bool = False) -> CollectionCreated:
    """Create the collection; with exist_ok an existing one answers instead (a CI job's idempotent step).

    What was asked is never ignored silently: `project` links the existing collection (a missing project is
    the same error as without exist_ok), another `type` is a CollectionError naming both (chunking and
    discovery treat the types differently, so it cannot be changed in place), and another `description` keeps
    the existing one with a warning (a re-run of a job must not rewrite what a person set). Create first and
    look up on failure, so a job racing another one still succeeds.
    """
    try:
        info = create_collection(c, name, type=type or "project-specific", description=description or "",
                                 project=project)
        return CollectionCreated(**info.model_dump(), created=True)
    except CollectionError:
        if not exist_ok or not c.store.has_collection(name):
            raise  # not there after all (an invalid name, a missing project): the creation error explains it
    existing = get_collection_info(c, name)
    if type and type != existing.type:
        raise CollectionError(f"Collection {name!r} exists with type {existing.type!r}, not {type!r}",
                              guidance="Leave the type out to use it as it is, or pick another name: a type is fixed "
                                       "at creation.", collection=name)
    warnings = []
    if description and description != existing.description:
        warnings.append(f"Collection {name!r} exists with the description {existing.description!r}; it was kept "
                        f"(not changed to {description!r}).")
    if project and project not in existing.projects:
        projects.link_collections(c, project, [name])
        existing = get_collection_info(c, name)
    return CollectionCreated(**existing.model_dump(), created=False, warnings=warnings)


def list_collections(c: Container, type: str | None = None, project: str | None = None, *,
                     limit: int | None = None, cursor: str | None = None) -> CollectionList:
    """One page (DEFAULT_PAGE by default) of the collections, by name; filters apply before paging.

    Counting a collection's documents reads its manifests, so only the page's collections are counted (the
    filters need only the collection's metadata and the project links).
    """
    if type:
        _check_type(type)
    c.store.refresh()
    links = _project_links(c)
    if project:
        projects.require_project(c, project)
    cols = [col for col in c.store.list_collections()
            if (not type or (col.metadata or {}).get("type", "project-specific") == type)
            and (not project or project in links.get(col.name, []))]
    shown, page = paginate(cols, lambda col: col.name, "collections", lambda col: _info(c, col, links),
                           limit=limit, cursor=cursor)
    return CollectionList(collections=shown, **page.model_dump())


def get_collection_info(c: Container, name: str) -> CollectionInfo:
    c.store.refresh()
    return _info(c, c.store.get_collection(name), _project_links(c))


def _has_records(c: Container, name: str) -> bool:
    """Whether a delete of `name` was cut short: its records (manifests, intents, links) outlived it."""
    return bool(c.store.meta.get(where={"collection": name}, include=[], limit=1)["ids"]) or name in _project_links(c)


def delete_collection(c: Container, name: str) -> Deleted:
    """Delete the collection, its documents and its links from projects.

    The Chroma collection goes first (queries stop at once), then its records. A kill in between leaves
    records without a collection: running the delete again finishes it, and `create_collection` clears
    them too, so a new collection of that name never inherits them.
    """
    validate_name(name)  # before the records' where-clause, which Chroma rejects for a lone surrogate
    c.store.refresh()
    if not c.store.exists:  # no store, no collection: not found before the write lock, which would create the store
        c.store.get_collection(name)  # (projects.require_project_before_write says why)
    with c.store.write_lock():
        if c.settings.server_mode:
            # Another process's live reindex: its lease went with the records, and its recovery then restored the
            # deleted collection from its own backup, with chunks no manifest names.
            check_no_reindex(c.store, name, "deleted")
        if c.store.has_collection(name):
            info = _info(c, c.store.get_collection(name), _project_links(c))
            c.store.delete_collection(name)
        elif _has_records(c, name):
            info = None
        else:
            c.store.get_collection(name)  # the not-found error, with its guidance
        c.store.registry_delete_collection(name)
        projects.drop_collection_links(c, name)
    return Deleted(deleted=name, kind="collection", chunks_removed=info.chunk_count if info else 0)
