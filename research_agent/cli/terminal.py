"""Stored text shown to people: control characters made visible before it reaches a terminal.

A catalog whose titles or content held escape sequences drove the user's terminal through `discover`,
`retrieve`, `query` and `kb get` (attack pass 2026-11-24: ESC[2J cleared the screen, ESC]8 made a disguised
link, U+202E reversed text). `--json` keeps the stored text exactly; JSON escapes it.
"""

from __future__ import annotations

import re

from rich.markup import escape as escape_markup

#: What stored text may not send to a terminal: C0 controls but tab and newline, DEL, C1 controls, and the
#: bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) that make text read backwards. A catalog
#: title holding ESC[2J cleared the user's screen through `retrieve`; ESC]8 made a disguised link.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`, `\\u202e`): people's output
    shows what is stored without letting it drive the terminal; `--json` keeps the text exactly."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def escape(text: str) -> str:
    """Stored text for a Rich markup string: controls made visible (`printable`), then markup escaped."""
    return escape_markup(printable(text))
