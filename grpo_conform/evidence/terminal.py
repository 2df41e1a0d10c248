"""Strings from records reach a terminal only escaped: no ANSI escapes, bidi overrides or zero-width tricks.

Everything a record carries (names, paths, messages, owners) is attacker-chosen. Control
characters (C0, DEL, C1: ANSI escape sequences start with ESC or CSI), format characters (bidi
embeddings/overrides/isolates, zero-width space/joiners, BOM), line and paragraph separators,
private-use and unassigned code points are written as `\\u{XXXX}`, and a backslash as `\\\\`, so
what is shown is what the record says, visibly.
"""

from __future__ import annotations

import unicodedata

_UNSAFE = {"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"}


def safe(value: object, limit: int = 500) -> str:
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text) - limit} more characters)"
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _UNSAFE:
            out.append(f"\\u{{{ord(ch):04X}}}")
        else:
            out.append(ch)
    return "".join(out)
