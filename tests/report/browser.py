"""A real headless Chromium (Debian's `chromium`) that renders the report: its DOM after
layout, and a screenshot checked to be a real picture.

Every Chromium is started in its own process group and that group is stopped by the
started process's PID when it is done or times out, with its helper processes (zygote,
renderer) included.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import zlib
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# Kept for people to look at: build/ is ignored by git and disposable.
ARTIFACTS = REPO / "build" / "test-artifacts"
WINDOW = (1280, 2000)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage")


def chromium_or_skip() -> str:
    """The browser, found as a person would run it (`chromium` on PATH)."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    return path


def run_chromium(browser: str, profile: Path, *args: str, timeout: float = 90) -> str:
    """Chromium's stdout; fails the test on a non-zero exit or a timeout."""
    proc = subprocess.Popen(
        [browser, *FLAGS, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"chromium did not finish within {timeout} s: {' '.join(args)}")
    finally:
        _stop(proc)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err[-2000:]}"
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Stop the process group of the Chromium we started (its PID is the group's ID)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def dump_dom(browser: str, profile: Path, page: Path) -> str:
    return run_chromium(browser, profile, "--dump-dom", page.as_uri())


MEASURED = "hefbuild-measured"


def measure(browser: str, profile: Path, page: Path, script: str) -> Any:
    """What `script` (a function body returning JSON-able data) finds in the page as
    Chromium laid it out, in the window of the screenshots. The page has no script of its
    own: a copy of it next to it (same links, same CSS) gets this one, run as it loads."""
    probe = page.with_name(f".measured-{page.name}")
    tail = (f"<script>(function(){{const out=document.createElement('pre');out.id='{MEASURED}';"
            f"out.textContent=JSON.stringify((function(){{{script}}})());"
            f"document.body.appendChild(out);}})();</script></body>")
    probe.write_text(page.read_text().replace("</body>", tail))
    try:
        dom = run_chromium(browser, profile, f"--window-size={WINDOW[0]},{WINDOW[1]}",
                           "--dump-dom", probe.as_uri())
    finally:
        probe.unlink()
    found = re.search(f'<pre id="{MEASURED}">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run: {dom[-500:]}"
    return json.loads(html.unescape(found.group(1)))


def screenshot(browser: str, profile: Path, page: Path, png: Path) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    run_chromium(browser, profile, f"--screenshot={png}",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", page.as_uri())
    return png


def check_picture(png: Path) -> None:
    """A PNG of the window's size that is not all one colour."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == WINDOW, (width, height)
    assert len(data) > 20_000, f"{png}: {len(data)} bytes, too small for a rendered page"
    try:
        from PIL import Image
    except ImportError:
        assert distinct_bytes(data) > 32, f"{png} looks like one colour"
        return
    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 16, f"{png} has {len(colours)} colours"


def distinct_bytes(data: bytes) -> int:
    """How many byte values the filtered scanlines hold: an image of one colour filters to
    a handful (its channel values, zeros and filter types), antialiased text to hundreds."""
    pixels, at = b"", 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            pixels += data[at + 8:at + 8 + length]
        at += 12 + length
    raw = zlib.decompress(pixels)
    return sum(bytes([b]) in raw for b in range(256))
