"""Characters that must never reach a terminal, a log line or a label raw, and how to show them safely;
messages as one bounded line.

One definition for the whole product: the push API refuses them in labels (422), job attribution drops
values holding them, and every printer (log lines, the exposition, the findings and alerts tables) escapes
them as `\\uXXXX`, so a label can neither split a line nor reorder what an operator reads.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (U+0085 NEL ends a line for many readers); the Unicode line and paragraph
# separators U+2028/U+2029; the bidirectional marks, embeddings, overrides and isolates that make text
# display in another order than it is stored (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069).
UNSAFE_CLASS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
UNSAFE = re.compile(f"[{UNSAFE_CLASS}]")


def first_unsafe(text: str) -> str | None:
    """The first unsafe character of `text` as U+XXXX, or None when it has none."""
    m = UNSAFE.search(text)
    return None if m is None else f"U+{ord(m.group()):04X}"


def escape_unsafe(text: str) -> str:
    """`text` with every unsafe character written as `\\uXXXX` (everything else unchanged)."""
    if UNSAFE.search(text) is None:  # the usual case: no copy
        return text
    return UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def shorten(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, at a word boundary when one is near, with "…" when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + "…"


def one_line(value: object, limit: int = 300) -> str:
    """`value` (a message, an exception) as one bounded line: all whitespace runs, newlines too, become one
    space. An exception without a message is named by its type."""
    text = " ".join(str(value).split())
    if not text and isinstance(value, BaseException):
        text = type(value).__name__
    return shorten(text, limit)
