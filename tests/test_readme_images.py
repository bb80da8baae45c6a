"""The README's pictures exist: every image it shows is a file in the repository, a real PNG,
small enough for a clone; the strategy comparison is shown in "Choosing a strategy" and says it
comes from the rehearsal engine."""
from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def test_every_image_the_readme_shows_exists_and_is_a_small_png():
    images = IMAGE.findall(README)
    assert images, "the README shows no image"
    for alt, target in images:
        assert alt.strip(), f"{target}: an image needs its alt text"
        path = ROOT / target
        assert path.is_file(), f"README shows {target}, which does not exist"
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{target} is not a PNG"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 600 and height >= 300, (target, width, height)
        assert len(data) < 150_000, f"{target} is {len(data)} bytes: redraw it smaller (a clone carries it for ever)"


def test_the_comparison_picture_is_in_choosing_a_strategy_and_says_rehearsal():
    section = README.split("\n## Choosing a strategy\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/img/compare-rehearsal.png" in [t for _, t in IMAGE.findall(section)]
    at = section.index("docs/img/compare-rehearsal.png")
    around = section[max(0, at - 700):at + 400]
    assert "rehearsal engine" in around and "not a GPU measurement" in around
    assert "python -m components compare" in around
