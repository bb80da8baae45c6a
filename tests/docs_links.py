"""The relative links of README.md and docs/*.md, and the anchors GitHub gives their headings.

A link is `[text](target)` or `![alt](target)` outside fenced code blocks and inline code; one
that names a scheme (`https:`, `mailto:`) is not ours to check. A target is a path relative to
the file it is written in, with an optional `#anchor`; `#anchor` alone is the same file.

GitHub's anchor for a heading (github-slugger, which github.com follows): the heading's text as
rendered (inline code and a link's text kept, their markup gone), lowercased, every character
that is not a letter, a digit, a space, `-` or `_` dropped, then each space turned into `-`; a
second heading with the same anchor gets `-1`, a third `-2`.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclasses.dataclass(frozen=True)
class Link:
    source: Path  # the file the link is written in
    line: int
    target: str  # as written


def _prose_lines(text: str):
    """(number, line) of each line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for one heading's text (without the duplicate suffix)."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = _LINK.sub(lambda m: m.group(1), text)
    kept = []
    for ch in text.lower():
        category = unicodedata.category(ch)
        if ch in " -_" or category[0] in "LN" or category[0] == "M":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> list[str]:
    """Every anchor of a Markdown text's headings, in order, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = []
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.append(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path, text: str | None = None) -> list[Link]:
    """The relative links written in one Markdown file (inline code and code blocks left out)."""
    text = path.read_text() if text is None else text
    found = []
    for number, line in _prose_lines(text):
        prose = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        for match in _LINK.finditer(prose):
            target = match.group(2)
            if not _SCHEME.match(target):
                found.append(Link(path, number, target))
    return found


def problem(link: Link, read=lambda p: p.read_text()) -> str | None:
    """What is wrong with one link, or None: the file it names is missing, or the heading."""
    path_part, _, anchor = link.target.partition("#")
    target = (link.source.parent / path_part).resolve() if path_part else link.source
    if not target.exists():
        return f"{path_part} does not exist"
    if anchor:
        if target.is_dir() or target.suffix != ".md":
            return f"#{anchor} on {path_part}, which is not a Markdown file"
        if anchor not in anchors(read(target)):
            return f"{path_part or link.source.name} has no heading whose anchor is #{anchor}"
    return None


def documents() -> list[Path]:
    """The front door and the topic pages."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def broken(paths: list[Path] | None = None) -> list[str]:
    """One line per broken link of the given files (default: README.md and docs/*.md)."""
    out = []
    for path in documents() if paths is None else paths:
        for link in links(path):
            why = problem(link)
            if why:
                out.append(f"{path.relative_to(REPO)}:{link.line}: ({link.target}) {why}")
    return out
