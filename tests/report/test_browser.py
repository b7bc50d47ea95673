"""The report in a real headless Chromium: it renders, and the rendered page shows the
figures of the last build. The screenshot is kept in build/test-artifacts/."""

from __future__ import annotations

import struct
import zlib

from .browser import (
    ARTIFACTS,
    check_picture,
    chromium_or_skip,
    distinct_bytes,
    dump_dom,
    screenshot,
)
from .samples import CHAINS, DEVICE_AGREEMENT, FREE_FIRST, TF_FIRST, TF_SECOND, write_build


def test_the_report_renders_with_the_last_builds_figures(tmp_path):
    browser = chromium_or_skip()
    from hefbuild.report.write import write_report

    page = write_report(write_build(tmp_path / "project"), CHAINS)
    dom = dump_dom(browser, tmp_path / "profile", page)
    assert "<svg" in dom and "</html>" in dom
    for figure in (TF_FIRST, FREE_FIRST, TF_SECOND, DEVICE_AGREEMENT):
        assert f"{figure:.3f}" in dom, figure
    for stage in ("fetch", "export", "quantize", "compile", "verify"):
        assert f'data-stage="{stage}"' in dom
    assert "NOT from a Hailo-10H device" in dom and "The last run of verify FAILED" in dom
    assert "&lt;script&gt;" in dom and "<script" not in dom  # escaped text stays text
    png = screenshot(browser, tmp_path / "profile", page, ARTIFACTS / "report-fixture.png")
    check_picture(png)



def _png(rows: list[bytes]) -> bytes:
    """An 8-bit RGB PNG of these scanlines (filter type 0)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    head = struct.pack(">II5B", len(rows[0]) // 3, len(rows), 8, 2, 0, 0, 0)
    body = zlib.compress(b"".join(b"\x00" + r for r in rows))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body)
            + chunk(b"IEND", b""))


def test_the_picture_check_tells_one_colour_from_a_page():
    white = [b"\xff\xff\xff" * 64] * 64
    ramp = [bytes((x * 4 + y) % 256 for x in range(192)) for y in range(64)]
    assert distinct_bytes(_png(white)) <= 2 and distinct_bytes(_png(ramp)) > 32
