"""The docs' pictures exist: every image README.md or a docs/ page shows is a file in the
repository, a real PNG, small enough for a clone; the strategy comparison is shown in
docs/choosing-a-strategy.md ("Comparing strategies") and says it comes from the rehearsal engine."""
from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHOOSING = (ROOT / "docs" / "choosing-a-strategy.md").read_text()
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def test_every_image_the_docs_show_exists_and_is_a_small_png():
    images = [(page, alt, target) for page in PAGES for alt, target in IMAGE.findall(page.read_text())]
    assert images, "no page shows an image"
    for page, alt, target in images:
        where = f"{page.relative_to(ROOT)} shows {target}"
        assert alt.strip(), f"{where}: an image needs its alt text"
        path = page.parent / target
        assert path.is_file(), f"{where}, which does not exist"
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{where}, which is not a PNG"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 600 and height >= 300, (target, width, height)
        assert len(data) < 150_000, f"{target} is {len(data)} bytes: redraw it smaller (a clone carries it for ever)"


def test_the_comparison_picture_is_in_comparing_strategies_and_says_rehearsal():
    section = CHOOSING.split("\n## Comparing strategies", 1)[1].split("\n## ", 1)[0]
    assert "img/compare-rehearsal.png" in [t for _, t in IMAGE.findall(section)]
    at = section.index("img/compare-rehearsal.png")
    around = section[max(0, at - 700):at + 400]
    assert "rehearsal engine" in around and "not a GPU measurement" in around
    assert "python -m components compare" in around
