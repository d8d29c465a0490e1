"""Excerpts of a source file for a notebook page: the lines that matter, as a fenced Markdown block.

A whole kernel printed as plain text is thousands of pixels a reader scrolls past; an excerpt cut
between two markers that are checked to be in the source stays true when the file changes (a
marker that disappears is an error, not a silently empty block).
"""

from __future__ import annotations


def excerpt(source: str, start: str, end: str | None = None, *, include_end: bool = False) -> str:
    """The text of ``source`` from the first line holding ``start`` up to the line holding ``end``
    (the first after it; left out unless ``include_end``), or to the end of that first line's block
    of non-blank lines when ``end`` is None."""
    i = source.find(start)
    if i < 0:
        raise ValueError(f"the source no longer contains the excerpt's start marker {start!r}")
    i = source.rfind("\n", 0, i) + 1  # from the start of its line
    if end is None:
        j = source.find("\n\n", i)
        return source[i: len(source) if j < 0 else j].rstrip("\n")
    j = source.find(end, i + len(start))
    if j < 0:
        raise ValueError(f"the source has no end marker {end!r} after {start!r}")
    if include_end:
        k = source.find("\n", j)
        j = len(source) if k < 0 else k
    else:
        j = source.rfind("\n", 0, j) + 1
    return source[i:j].rstrip("\n")


def fenced(text: str, language: str = "python", note: str = "") -> str:
    """``text`` as a fenced Markdown code block (with ``note`` as a line of prose before it)."""
    fence = "````" if "```" in text else "```"
    return (f"{note}\n\n" if note else "") + f"{fence}{language}\n{text}\n{fence}"
