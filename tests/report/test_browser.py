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
    measure,
    screenshot,
)
from .samples import (
    CHAINS,
    CPU_STAGES,
    DEVICE_AGREEMENT,
    FREE_FIRST,
    TF_FIRST,
    TF_SECOND,
    write_build,
)


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


# -- a sweep, and the models that were not built -----------------------------------------

NAV = """
const links = [...document.querySelectorAll('header nav a')];
const badges = [...document.querySelectorAll('header nav .badge')];
const box = e => e.getBoundingClientRect();
return links.map((link, i) => {
  const badge = badges[i], next = links[i + 1], group = badge.closest('[data-model]');
  return {link: link.textContent, badge: badge.textContent, group: group && group.dataset.model,
          own: box(badge).left - box(link).right,
          next: next && box(next).top === box(link).top ?
                box(next).left - box(badge).right : null};
});
"""

SWEEP = """
const rows = [...document.querySelectorAll('section.sweep table.sweep-stages tr')].slice(1);
const checks = [...document.querySelectorAll('section.model')].map(s =>
  [s.dataset.model, [...s.querySelectorAll('div.check h3')].map(h => h.textContent)]);
const unbuilt = [...document.querySelectorAll('section.unbuilt li')].map(li =>
  [li.dataset.model, li.textContent]);
return {rows: rows.map(r => [r.className, r.dataset.param || r.dataset.stage,
                             [...r.cells].slice(1).map(c => c.textContent)]),
        checks: Object.fromEntries(checks), unbuilt: Object.fromEntries(unbuilt)};
"""


def seen_in_sweep(tmp_path, chains=None) -> dict:
    """What the rendered page of the sweep sample shows (its own declarations, or `chains`)."""
    browser = chromium_or_skip()
    from hefbuild.report.write import write_report

    from .sweep_samples import sweep_chains, write_sweep

    page = write_report(write_sweep(tmp_path / "project"), chains or sweep_chains())
    return measure(browser, tmp_path / "profile", page, SWEEP)


def test_each_badge_sits_with_its_own_model(tmp_path):
    """The header's links as laid out: each badge nearer its own name than the next one
    (once, `FAILED` of @int4 sat against the name of @qdq), and in its model's box."""
    browser = chromium_or_skip()
    from hefbuild.report.content import chains_of
    from hefbuild.report.write import write_report

    from .sweep_samples import INT4, SWEEP, write_sweep

    page = write_report(write_sweep(tmp_path / "project"),
                        chains_of({m: "cpu-ort" for m in SWEEP}))
    nav = measure(browser, tmp_path / "profile", page, NAV)
    assert [(n["link"], n["badge"]) for n in nav] == [
        (m, "FAILED" if m == INT4 else "passed") for m in SWEEP]
    for item in nav[:-1]:
        assert item["next"] is not None, "the header wrapped: widen the window"
        assert 0 <= item["own"] < item["next"], item
    assert [n["group"] for n in nav] == list(SWEEP)
    check_picture(screenshot(browser, tmp_path / "profile", page,
                             ARTIFACTS / "report-sweep.png"))


def test_each_variants_check_is_titled_by_its_own_method(tmp_path):
    from hefbuild.report.content import chains_of

    from .sweep_samples import METHODS, SWEEP

    seen = seen_in_sweep(tmp_path, chains_of({m: "cpu-ort" for m in SWEEP}))
    assert {m: seen["checks"][m] for m in SWEEP} == {
        m: [f"verify: {METHODS[m]} ONNX Runtime against float32 transformers"] for m in SWEEP}


def test_a_sweep_table_leads_with_the_parameters_that_differ(tmp_path):
    from .sweep_samples import METHODS, SWEEP

    seen = seen_in_sweep(tmp_path)
    params = [r for r in seen["rows"] if r[0] == "param"]
    assert params and seen["rows"][:len(params)] == params, "the parameters come first"
    assert params == [["param", "quantize.method", [METHODS[m] for m in SWEEP]],
                      ["param", "quantize.samples", ["32", "32", "16"]]]  # block_size: same
    assert [r[1] for r in seen["rows"][len(params):]] == list(CPU_STAGES)


def test_models_not_built_say_why(tmp_path):
    from .sweep_samples import HELD, MISMATCH

    assert seen_in_sweep(tmp_path)["unbuilt"] == {
        "never": "never: no run has built it yet (`doit verify:never`)",
        "hub": f"hub: {'; '.join(HELD)}",
        "blocked": f"blocked: fetch failed (the stages after it did not run): {MISMATCH}"}
