"""Export the ToolGym MCP catalog as one Markdown file per server, for `kb add-folder`.

Usage: .venv/bin/python benchmarks/toolgym_export.py SOURCE [--out benchmarks/.cache/toolgym/catalog]

SOURCE is a checkout of Ziqiao-git/ToolGym (or its `MCP_INFO_MGR/smithery_metadata` folder) or a bare
git directory of it (read with `git ls-tree` / `git cat-file`, no work tree needed). The catalog is 924
JSON files, 9,976 tools (510 without a description). Each server becomes `<json stem>.md`:

    ---
    title: "<display name>"
    description: "<server description>"
    keywords: ["<qualified name>"]
    ---
    # <display name>
    <server description>
    ## <tool name>
    <tool description, flattened>
    Parameters: name (type, required): description; ...

Descriptions are flattened so that no line of theirs can open a heading or a code fence (a `## Usage`
inside a description would otherwise become a section of its own and break the tool <-> section map).
Output is deterministic: files and tools in catalog order, no timestamps. `manifest.json` (next to
the catalog folder, not inside it, so add-folder never ingests it) maps each file to its server and
tool names, which the benchmark uses to turn hits back into (server, tool) pairs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / ".cache" / "toolgym" / "catalog"
CATALOG_DIR = "MCP_INFO_MGR/smithery_metadata"
#: Per-parameter description cap: schemas carry enum lists and nested objects of 2-5 KB; the first
#: sentence-or-so says what the parameter is, the rest only dilutes the section's embedding.
PARAM_DESC_CHARS = 160
#: At most this many top-level parameters per tool (the largest tools have 60+).
MAX_PARAMS = 25
#: Tool descriptions above this are cut (a few are 10-20 KB of examples); the chunker would split them.
TOOL_DESC_CHARS = 3000
_CONTROL = {c for c in range(32) if c not in (9, 10)} | {127}


def clean(text: Any) -> str:
    """Text without control characters, NFC-normalized (foreign scripts kept as they are)."""
    if not isinstance(text, str):
        return ""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "".join(" " if ord(ch) in _CONTROL else ch for ch in text)


def flatten(text: Any, limit: int) -> str:
    """Description text safe inside a section: no headings, fences, HTML comments or rules; bounded."""
    lines = []
    for line in clean(text).split("\n"):
        line = line.strip()
        if line.startswith("```") or line.startswith("~~~"):
            line = line.strip("`~").strip()  # keep a fence's language tag as a word, drop the fence
        line = re.sub(r"^#+\s*", "", line)  # a heading inside a description becomes a plain line
        line = re.sub(r"^(-{3,}|\*{3,}|_{3,}|={3,})$", "", line)  # setext underlines and rules
        line = line.replace("<!--", "< !--")
        lines.append(line)
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return out if len(out) <= limit else out[:limit].rstrip() + " …"


def one_line(text: Any, limit: int) -> str:
    out = " ".join(clean(text).split())
    return out if len(out) <= limit else out[:limit].rstrip() + " …"


def _params(schema: Any) -> str:
    """Top-level parameters as `name (type, required): description; ...` on one line."""
    if not isinstance(schema, dict):
        return ""
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return ""
    required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
    parts = []
    for name, spec in list(props.items())[:MAX_PARAMS]:
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type") or ("enum" if "enum" in spec else "")
        kind = "/".join(map(str, kind)) if isinstance(kind, list) else str(kind)
        tags = ", ".join(t for t in (kind, "required" if name in required else "") if t)
        desc = one_line(spec.get("description", ""), PARAM_DESC_CHARS)
        parts.append(f"{one_line(name, 80)}{f' ({tags})' if tags else ''}{f': {desc}' if desc else ''}")
    more = len(props) - MAX_PARAMS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def tool_name(tool: dict[str, Any]) -> str:
    """The tool's name as a heading can hold it (one line, no leading #)."""
    return one_line(tool.get("name"), 200).lstrip("#").strip() or "unnamed"


def yaml_str(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escaping is valid YAML; control characters are gone)."""
    return json.dumps(text, ensure_ascii=False)


def render_server(server: dict[str, Any]) -> str:
    qname = one_line(server.get("qualifiedName"), 300)
    title = one_line(server.get("displayName"), 200) or qname or "Unnamed server"
    desc = one_line(server.get("description"), 1000)
    out = ["---", f"title: {yaml_str(title)}", f"description: {yaml_str(desc)}",
           f"keywords: [{yaml_str(qname)}]", "---", "", f"# {title}", ""]
    if desc:
        # 1 of the 924 servers starts its description with "## About ...": as a body line it must not
        # open a section of its own (front matter keeps the text as it is).
        out += [re.sub(r"^#+\s*", "", desc), ""]
    for tool in server.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        out += [f"## {tool_name(tool)}", ""]
        text = flatten(tool.get("description"), TOOL_DESC_CHARS)
        out += [text or "(no description)", ""]
        params = _params(tool.get("inputSchema") or tool.get("input_schema"))
        if params:
            out += [f"Parameters: {params}", ""]
    return "\n".join(out).rstrip() + "\n"


def _git_files(git_dir: Path) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of every catalog JSON at HEAD of a bare git directory, in path order."""
    listing = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "HEAD", f"{CATALOG_DIR}/"],
                             check=True, capture_output=True, text=True).stdout
    entries = sorted((line.split("\t", 1)[1], line.split()[2]) for line in listing.splitlines()
                     if line.endswith(".json"))
    proc = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "--batch"], check=True, capture_output=True,
                          input="".join(f"{sha}\n" for _, sha in entries).encode())
    data, pos = proc.stdout, 0
    for path, _sha in entries:
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        yield path, data[header_end + 1: header_end + 1 + size]
        pos = header_end + 1 + size + 1


def read_catalog(source: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(json stem, server record) for each catalog file, from a checkout, its catalog folder or a git dir."""
    folder = source / CATALOG_DIR if (source / CATALOG_DIR).is_dir() else source
    if any(folder.glob("*.json")):
        files = ((p.name, p.read_bytes()) for p in sorted(folder.glob("*.json")))
    elif (source / "HEAD").is_file() and (source / "objects").is_dir():
        files = _git_files(source)
    else:
        raise SystemExit(f"{source}: neither a ToolGym checkout, its {CATALOG_DIR} folder, nor a git directory")
    for name, raw in files:
        try:
            record = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError as exc:
            print(f"skipped {name}: not JSON ({exc})", file=sys.stderr)
            continue
        if isinstance(record, dict):
            yield Path(name).stem, record


def export(source: Path, out: Path) -> dict[str, Any]:
    """Write the Markdown catalog to `out` (replacing it) and `manifest.json` beside it; return the manifest."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    manifest: dict[str, Any] = {}
    for stem, server in read_catalog(source):
        file = f"{stem}.md"
        (out / file).write_text(render_server(server), encoding="utf-8")
        manifest[file] = {"server": one_line(server.get("qualifiedName"), 300),
                          "tools": [tool_name(t) for t in server.get("tools") or [] if isinstance(t, dict)]}
    (out.parent / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True),
                                              encoding="utf-8")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", type=Path, help="ToolGym checkout, its catalog folder, or its bare git directory")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    manifest = export(args.source, args.out)
    tools = sum(len(v["tools"]) for v in manifest.values())
    print(f"{len(manifest)} servers, {tools} tools -> {args.out}")


if __name__ == "__main__":
    main()
