"""Text from the command line and stdin as Unicode the library can use, whatever bytes the shell passed.

Python decodes argv with surrogateescape: `query $'\\xff retry'` arrives as "\\udcff retry", a string no tokenizer,
embedder or Chroma accepts (it crashed with exit 1, "Unexpected failure (TypeError)"). People mean text, so text
is decoded as UTF-8 with replacement (U+FFFD), as a browser shows a Latin-1 page.
"""

from __future__ import annotations

import os
import sys

from research_agent.text import clean_text


def decode_arg(arg: str) -> str:
    """A command-line argument as UTF-8 text; undecodable bytes become U+FFFD.

    An argument naming a file that exists keeps its bytes: a Latin-1 file name is still a valid path, and
    replacing its bytes would make `kb add-document caf\\xe9.md` miss the file. The library cleans any
    surrogates left in text it tokenizes or stores (research_agent.text.clean_text).
    """
    if arg.isascii():
        return arg
    try:
        arg.encode("utf-8")
        return arg  # already valid text: no surrogates
    except UnicodeEncodeError:
        pass
    if os.path.lexists(arg):
        return arg
    try:
        return arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that no byte escapes to (not from the OS): replace it as such
        return clean_text(arg)


def decode_args(args: list[str]) -> list[str]:
    return [decode_arg(a) for a in args]


def read_stdin() -> str:
    """All of stdin as UTF-8 text with replacement: read as bytes, since the text layer's decoding depends on
    the locale (strict under UTF-8: UnicodeDecodeError; surrogateescape under C: lone surrogates)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text-only stream (a test harness): already decoded
        return sys.stdin.read()
    return buffer.read().decode("utf-8", "replace")
