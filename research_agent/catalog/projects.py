"""Projects: named groups of linked collections, with default collections for queries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from research_agent.catalog.common import Deleted, now_iso, paginate
from research_agent.errors import CollectionError
from research_agent.storage.registry import project_key
from research_agent.storage.store import validate_name

if TYPE_CHECKING:
    from research_agent.container import Container


class ProjectInfo(BaseModel):
    name: str
    description: str
    collections: list[str]
    default_collections: list[str]
    created_at: str


class ProjectList(BaseModel):
    """One page of projects in name order (catalog/common.py `paginate`)."""

    projects: list[ProjectInfo]
    total: int
    next_cursor: str | None = None


def require_project(c: Container, name: str) -> dict[str, Any]:
    c.store.refresh()
    rec = c.store.registry_get([project_key(name)]).get(project_key(name))
    if rec is None:
        raise CollectionError(
            f"Project {name!r} not found",
            guidance="Run `research-agent projects list`, or create it with `research-agent projects create`.",
            project=name,
        )
    return rec


def require_project_before_write(c: Container, name: str) -> None:
    """Before the write lock of a write to an existing project: on a store not created yet, its not-found error.

    Trigger: `projects link typo --collections c` on a moved store answered "not found" but the write lock had
    made an empty store at the path, and `mv store.mv store` then nested the real store in it (finding F1 of the
    H2b attack pass). Rule: a write that changes nothing creates nothing; a missing store has no projects and no
    collections, so a write whose target must exist answers before any lock. The check under the lock stays (the
    store may be created meanwhile)."""
    if not c.store.exists:
        require_project(c, name)


def _save(c: Container, rec: dict[str, Any]) -> ProjectInfo:
    c.store.registry_put({project_key(rec["name"]): rec}, "project")
    return ProjectInfo(**rec)


def _require_collections(c: Container, names: list[str]) -> list[str]:
    if not names:
        raise CollectionError("No collections given", guidance="Pass --collections a,b.")
    return c.store.require_collections(names)


def create_project(c: Container, name: str, description: str = "") -> ProjectInfo:
    validate_name(name, "project")
    with c.store.write_lock():
        if c.store.registry_get([project_key(name)]):
            raise CollectionError(f"Project {name!r} already exists", guidance="Pick another name.", project=name)
        return _save(c, {"name": name, "description": description or "", "collections": [],
                         "default_collections": [], "created_at": now_iso()})


def list_projects(c: Container, *, limit: int | None = None, cursor: str | None = None) -> ProjectList:
    """One page (DEFAULT_PAGE by default) of the projects, by name."""
    c.store.refresh()
    shown, page = paginate(list(c.store.registry_find("project").values()), lambda r: r["name"], "projects",
                           lambda r: ProjectInfo(**r), limit=limit, cursor=cursor)
    return ProjectList(projects=shown, **page.model_dump())


def get_project_info(c: Container, name: str) -> ProjectInfo:
    return ProjectInfo(**require_project(c, name))


def delete_project(c: Container, name: str) -> Deleted:
    """Delete the project; its collections stay."""
    require_project(c, name)
    with c.store.write_lock():
        c.store.registry_delete([project_key(name)])
    return Deleted(deleted=name, kind="project")


def link_collections(c: Container, name: str, collections: list[str]) -> ProjectInfo:
    require_project_before_write(c, name)
    with c.store.write_lock():
        rec = require_project(c, name)
        rec["collections"] = list(dict.fromkeys(rec["collections"] + _require_collections(c, collections)))
        return _save(c, rec)


def unlink_collections(c: Container, name: str, collections: list[str]) -> ProjectInfo:
    require_project_before_write(c, name)
    with c.store.write_lock():
        rec = require_project(c, name)
        not_linked = [n for n in collections if n not in rec["collections"]]
        if not_linked:
            raise CollectionError(f"Not linked to {name!r}: {', '.join(not_linked)}", project=name)
        rec["collections"] = [n for n in rec["collections"] if n not in collections]
        rec["default_collections"] = [n for n in rec["default_collections"] if n not in collections]
        return _save(c, rec)


def set_default_collections(c: Container, name: str, collections: list[str]) -> ProjectInfo:
    """Set the collections a `--project` query searches; they are linked first if they are not."""
    require_project_before_write(c, name)
    with c.store.write_lock():
        rec = require_project(c, name)
        wanted = _require_collections(c, collections)
        rec["collections"] = list(dict.fromkeys(rec["collections"] + wanted))
        rec["default_collections"] = wanted
        return _save(c, rec)


def drop_collection_links(c: Container, collection: str) -> None:
    """Called (under the write lock) when a collection is deleted."""
    changed = {}
    for key, rec in c.store.registry_find("project").items():
        if collection in rec["collections"] or collection in rec["default_collections"]:
            rec["collections"] = [n for n in rec["collections"] if n != collection]
            rec["default_collections"] = [n for n in rec["default_collections"] if n != collection]
            changed[key] = rec
    c.store.registry_put(changed, "project")
