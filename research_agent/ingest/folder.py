"""The folder walk and safe reads: which files a run reads, which entries it could not, what --prune may remove
and which document key a folder's files get.

Every hostile entry (FIFO, device, socket, symlink loop, broken symlink, non-UTF-8 name, unreadable folder)
becomes a per-entry problem with a reason, never an exception that ends the run (issue 11, items 7, 10, 12).

Over 400 lines (~430) because the walk, the "is it really gone?" checks --prune relies on and the key a
file gets read the same FolderWalk and manifests; the three parts are each under 150 lines and would split
cleanly into walk / prune plan / keys if one grows.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from research_agent.errors import DocumentError

# Directories nobody wants in a knowledge base; .gitignore files add to these.
DEFAULT_EXCLUDES = (".git", ".hg", ".svn", "node_modules", ".venv", "venv", "env", "__pycache__", ".tox",
                    ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "site-packages",
                    ".idea", ".vscode", ".next", "target", ".eggs", "*.egg-info")
# A .gitignore decides what stays private, so it is read whole or the run stops; real ones are a few KB.
GITIGNORE_MAX_BYTES = 1024 * 1024
_READ_CHUNK = 1024 * 1024
_FILE_TYPES = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "folder"))


# -- reading -------------------------------------------------------------------------------------------------
def file_type(mode: int) -> str:
    """A file type in words, for reasons like "not a regular file (FIFO)"."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "special file")


def not_regular(path: Path, mode: int) -> DocumentError:
    return DocumentError(f"{path.name} is not a regular file ({file_type(mode)})",
                         guidance="Only regular files are read; exclude it or point at the real file.",
                         path=display(str(path)))


def too_large(size: str, limit: int) -> DocumentError:
    return DocumentError(f"{size} exceeds the size limit of {limit / 2**20:g} MB",
                         guidance="Raise RESEARCH_AGENT_MAX_FILE_MB (MAX_PDF_MB for PDFs) or exclude the file.")


def read_regular_file(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, else DocumentError; OSError when it cannot be read.

    The file is opened non-blocking and its type checked on the open descriptor, so a FIFO swapped in after
    an earlier stat cannot block (a FIFO hung ingestion forever), and at most limit + 1 bytes are read, so
    /dev/zero, /proc files (st_size 0) and files growing while read cannot exhaust memory.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        if st.st_size > limit:
            raise too_large(f"{st.st_size / 2**20:.1f} MB", limit)
        parts: list[bytes] = []
        got = 0
        while got <= limit:
            part = os.read(fd, min(_READ_CHUNK, limit + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    finally:
        os.close(fd)
    if got > limit:
        raise too_large(f"more than {limit} bytes (read while the file grew or reported size 0)", limit)
    return b"".join(parts)


def parse_bytes(path: Path, raw: bytes) -> Any:
    """Parse the bytes already read, so the hash and the chunks describe the same version of the file."""
    from research_agent.ingest import parsing

    return parsing.parse_bytes(raw, path)


# -- names ----------------------------------------------------------------------------------------------------
def display(name: str) -> str:
    """A name safe for JSON, Chroma and terminals: undecodable bytes shown as \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- selection -------------------------------------------------------------------------------------------------
def gitignore_spec(folder: Path) -> Any:
    """The folder's .gitignore as a matcher (None without one); bounded, regular files only."""
    import pathspec

    gi = folder / ".gitignore"
    try:
        if not stat.S_ISREG(os.stat(gi).st_mode):
            return None
        text = read_regular_file(gi, GITIGNORE_MAX_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except (OSError, DocumentError) as exc:
        # Without it, files the user keeps private could be ingested: stop instead.
        raise DocumentError(f"Cannot read {display(str(gi))}: {getattr(exc, 'strerror', None) or exc}",
                            guidance="Fix the .gitignore (readable, under 1 MB) or remove it.") from None
    lines = text.splitlines()
    return pathspec.PathSpec.from_lines("gitwildmatch", lines) if lines else None


@dataclass
class Selection:
    """This run's rules (recursion, default excludes, .gitignore, --include/--exclude), for walk and prune."""

    recursive: bool
    include: list[str]
    exclude: list[str]
    spec: Any = None

    def dir_excluded(self, rel: str, name: str) -> bool:
        if any(fnmatch.fnmatch(name, pat) for pat in DEFAULT_EXCLUDES):
            return True
        return self._ignored(rel, name, is_dir=True)

    def _ignored(self, rel: str, name: str, *, is_dir: bool) -> bool:
        if self.spec is not None and self.spec.match_file(rel + ("/" if is_dir else "")):
            return True
        return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat) for pat in self.exclude)

    def file_selected(self, rel: str, name: str) -> bool:
        if self._ignored(rel, name, is_dir=False):
            return False
        return not self.include or any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in self.include)

    def selects(self, rel: str) -> bool:
        """Would this walk pick the file at `rel` (relative to the folder) if it were there?"""
        parts = rel.split("/")
        if len(parts) > 1 and not self.recursive:
            return False
        if any(self.dir_excluded("/".join(parts[:i + 1]), d) for i, d in enumerate(parts[:-1])):
            return False
        return self.file_selected(rel, parts[-1])


# -- the walk ----------------------------------------------------------------------------------------------------
@dataclass
class WalkProblem:
    path: Path     # absolute
    reason: str
    failed: bool   # True: an I/O failure (the old indexed version may still be right); False: skipped


@dataclass
class FolderWalk:
    folder: Path
    selection: Selection
    files: list[Path] = field(default_factory=list)
    problems: list[WalkProblem] = field(default_factory=list)
    unreadable: list[Path] = field(default_factory=list)
    prefix: str | None = None  # the key prefix of this folder's documents (folder_prefix)

    def blocked_by(self, path: Path) -> Path | None:
        """The unreadable folder above `path`, if any: nothing below it may be pruned."""
        return next((d for d in self.unreadable if path.is_relative_to(d)), None)


def walk_folder(folder: Path, *, recursive: bool, include: Iterable[str], exclude: Iterable[str],
                allowed_roots: list[Path] | None) -> FolderWalk:
    """Regular files under `folder` (each folder's files, then its subfolders, by name) and the entries skipped."""
    walk = FolderWalk(folder, Selection(recursive, list(include), list(exclude), gitignore_spec(folder)))
    roots = allowed_roots if allowed_roots is not None else [folder]
    pending = [folder]
    while pending:
        here = pending.pop()
        subdirs = [d for entry in _scan(walk, here) if (d := _visit(walk, entry, roots)) is not None]
        pending.extend(reversed(subdirs))
    return walk


def _scan(walk: FolderWalk, here: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(here) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        walk.unreadable.append(here)
        walk.problems.append(WalkProblem(here, f"folder could not be read: {exc.strerror or exc}; nothing below "
                                               "it was ingested or pruned", failed=True))
        return []


def _visit(walk: FolderWalk, entry: os.DirEntry, roots: list[Path]) -> Path | None:
    """File the entry (a file, a problem or nothing); returns it when it is a subfolder to descend into."""
    path = Path(entry.path)
    rel = path.relative_to(walk.folder).as_posix()
    sel = walk.selection
    try:
        is_link = entry.is_symlink()
        is_dir = not is_link and entry.is_dir(follow_symlinks=False)
    except OSError as exc:
        walk.problems.append(WalkProblem(path, f"cannot inspect: {exc.strerror or exc}", failed=True))
        return None
    if is_dir:
        if not sel.recursive or sel.dir_excluded(rel, entry.name):
            return None
        if not is_utf8(entry.name):
            walk.problems.append(WalkProblem(path, "folder name is not valid UTF-8; rename it to ingest its files",
                                             failed=False))
            return None
        return path
    if not sel.file_selected(rel, entry.name):
        return None
    reason = _file_problem(entry, path, is_link, roots)
    if reason is None:
        walk.files.append(path)
    elif reason:
        walk.problems.append(WalkProblem(path, reason, failed=False))
    return None


def _file_problem(entry: os.DirEntry, path: Path, is_link: bool, roots: list[Path]) -> str | None:
    """Why this entry cannot be read as a file; None when it can, "" when it is silently not followed."""
    if not is_utf8(entry.name):
        return "file name is not valid UTF-8; rename it to ingest it"
    try:
        st = os.stat(path)  # follows the link; ELOOP for a loop, ENOENT for a broken link
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop"
        if is_link and exc.errno == errno.ENOENT:
            return f"broken symlink (to {display(os.readlink(path))})"
        return f"cannot inspect: {exc.strerror or exc}"
    if is_link:
        target = Path(os.path.realpath(path))
        if not any(target == r or r in target.parents for r in roots):
            return f"symlink to {display(str(target))} leads outside the folder; not followed"
    if stat.S_ISDIR(st.st_mode):
        return ""  # a symlinked folder: folders are walked by their real path only
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({file_type(st.st_mode)})"
    return None


# -- prune -------------------------------------------------------------------------------------------------------
def why_not_gone(walk: FolderWalk, path: Path) -> str | None:
    """None when the file at `path` is really gone and this run may prune it; else why it stays.

    Really gone: under the walked folder, selected by this run's rules, no folder above it failed to be read,
    and lstat says it does not exist (ENOENT, or ENOTDIR when a folder on its path became a file).
    """
    blocked = walk.blocked_by(path)
    if blocked is not None:
        return f"a folder above it could not be read ({display(str(blocked))})"
    if not walk.selection.selects(path.relative_to(walk.folder).as_posix()):
        return "not selected by this run (recursion, --include/--exclude, .gitignore or default excludes)"
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"cannot tell whether it exists: {exc.strerror or exc}"
    return "the file still exists but was not read in this run"


def prune_plan(walk: FolderWalk, manifests: Mapping[str, dict[str, Any]],
               seen: set[str]) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """(documents to remove, [(document, why it stays)]) among this folder's documents not seen in this run."""
    gone: dict[str, dict[str, Any]] = {}
    kept: list[tuple[str, str]] = []
    for key, m in sorted(manifests.items(), key=lambda kv: kv[1].get("document", "")):
        if key in seen or m.get("kind") != "document" or not m.get("path"):
            continue
        path = Path(m["path"])
        if not path.is_relative_to(walk.folder):
            continue  # another folder's document
        reason = why_not_gone(walk, path)
        if reason is None:
            gone[key] = m
        else:
            kept.append((m["document"], reason))
    return gone, kept


# -- prune of files that are gone, whatever folder they were ingested from (kb prune) --------------------------
#: What `why_kept_missing` returns for a file that exists: not a prune candidate, and nothing to report.
PRESENT = "present"
#: A folder this close to the filesystem root ("/", "/mnt", "/media", "/Volumes") is where drives and shares
#: are mounted: when it is the nearest folder left of a missing file, the drive is more likely unmounted than
#: the file deleted (parts of "/media" are ("/", "media"), 2).
MOUNT_DEPTH = 2


def is_gone(path: Path) -> bool:
    """lstat says `path` does not exist (ENOENT, or ENOTDIR: a folder on its path became a file); any other
    error (EACCES, EIO ...) is not proof of absence."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _nearest_folder(path: Path) -> tuple[Path | None, str | None]:
    """(the nearest existing folder above `path`, None) or (None, why it cannot be told)."""
    for parent in path.parents:
        try:
            st = os.lstat(parent)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            return None, f"cannot tell whether {display(str(parent))} exists: {exc.strerror or exc}"
        if stat.S_ISDIR(st.st_mode):
            return parent, None
    return None, "no folder above it exists"  # (the root always does)


def _looks_unmounted(folder: Path, empty: bool) -> bool:
    """An unmounted drive leaves an empty mount folder, or none below a top-level folder such as /media."""
    return empty or len(folder.parts) <= MOUNT_DEPTH or os.path.ismount(folder)


def why_kept_missing(path: Path, *, confirmed: bool) -> str | None:
    """None when the recorded file `path` is really gone and may be pruned; PRESENT when it exists; else why
    it stays although it may be gone.

    Gone means lstat ENOENT/ENOTDIR and the nearest folder left above it can be listed. Without `confirmed`
    (kb prune --under naming a folder that holds it) a file whose nearest folder is empty, a mount point or
    top-level stays too: that is what an unmounted drive looks like, and its documents must survive a prune.
    """
    try:
        os.lstat(path)
        return PRESENT
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        return f"cannot tell whether it exists: {exc.strerror or exc}"
    near, why = _nearest_folder(path)
    if near is None:
        return why
    try:
        with os.scandir(near) as entries:
            empty = next(entries, None) is None
    except OSError as exc:
        return f"the folder {display(str(near))} cannot be read: {exc.strerror or exc}"
    if not confirmed and _looks_unmounted(near, empty):
        return (f"its nearest remaining folder {display(str(near))} is empty, a mount point or top-level, as with "
                "an unmounted drive; mount it, or confirm the files are gone for good with --under <their folder>")
    return None


def missing_plan(manifests: Mapping[str, dict[str, Any]], under: Path | None,
                 roots: list[Path] | None) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """(documents whose files are gone, [(document, why it stays)]) among the file documents recorded under
    `under` (all when None) and the allowed roots; research and notes have no file and are never candidates."""
    gone: dict[str, dict[str, Any]] = {}
    kept: list[tuple[str, str]] = []
    for key, m in sorted(manifests.items(), key=lambda kv: kv[1].get("document", "")):
        if m.get("kind") != "document" or not m.get("path"):
            continue
        path = Path(m["path"])
        if (under is not None and not path.is_relative_to(under)) or (
                roots is not None and not any(path.is_relative_to(r) for r in roots)):
            continue
        reason = why_kept_missing(path, confirmed=under is not None)
        if reason is None:
            gone[key] = m
        elif reason != PRESENT:
            kept.append((m["document"], reason))
    return gone, kept


# -- document keys -------------------------------------------------------------------------------------------------
def folder_prefix(root: Path, manifests: Mapping[str, dict[str, Any]]) -> str:
    """The key prefix of `root`'s documents: `docs` for /a/docs, so keys read `docs/guide.md` (as always).

    Stable: a folder ingested before keeps the prefix its documents carry. Distinct: when another folder
    already owns `docs/...` (its manifests' paths are elsewhere, e.g. /b/docs), parent folders are added
    (`a/docs`) until the prefix is free, so same-named folders never overwrite each other's documents.
    """
    reused = Counter(p for m in manifests.values() if (p := _prefix_of(root, m)) is not None)
    if reused:
        return reused.most_common(1)[0][0]
    parts = root.parts[1:]  # without the anchor "/"
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[-depth:])
        if not any(_owned_by_other(root, prefix, m) for m in manifests.values()):
            return prefix
    return root.as_posix()


def _prefix_of(root: Path, m: dict[str, Any]) -> str | None:
    """The prefix `m`'s key shows for `root`, when `m` is a file under `root` ingested with a folder's prefix."""
    path, doc = m.get("path"), m.get("document", "")
    if m.get("kind") != "document" or not path or not Path(path).is_relative_to(root):
        return None
    rel = Path(path).relative_to(root).as_posix()
    if not doc.endswith("/" + rel):
        return None
    prefix = doc[: -len(rel) - 1]
    return prefix if prefix == root.name or prefix.endswith("/" + root.name) or prefix == root.as_posix() else None


def _owned_by_other(root: Path, prefix: str, m: dict[str, Any]) -> bool:
    if not m.get("document", "").startswith(prefix + "/"):
        return False
    return not (m.get("path") and Path(m["path"]).is_relative_to(root))


def file_key(path: Path, candidate: str, manifests: Mapping[str, dict[str, Any]], collection_key: Any) -> str:
    """A single file's key: the key it had before, else `candidate` unless another file owns it, else its
    absolute path (unique)."""
    same = sorted(
        m["document"] for m in manifests.values() if m.get("kind") == "document" and m.get("path") == str(path)
    )
    if same:
        return same[0]
    owner = manifests.get(collection_key(candidate))
    if owner is None or not owner.get("path"):
        return candidate
    return path.as_posix()
