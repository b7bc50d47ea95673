"""`doit verify:tiny-hailo-llama` end to end over a real sshd on loopback.

The chain up to compile runs with the DFC test double; the device host is this machine over
ssh, whose `hailo_platform` is the test double (tests/fakes/hailo_platform): it runs the HEF's
ONNX graph on ONNX Runtime, so a pass is real token agreement with the float32 reference, and
FAKE_HAILO_CONTROL injects the failures. Nothing here is a real device result (the stage log
says so).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from e2e.conftest import REPO, copy_project

from .conftest import MODEL, VERIFY, Bench, error_line

pytestmark = pytest.mark.e2e


def uploads_of_hef(log: str) -> int:
    return sum(1 for line in log.splitlines() if "[transport] put model.hef" in line)


def test_pass_is_real_agreement_cached_and_forced(bench: Bench):
    first = bench.verify()
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.outcomes()[VERIFY] == "built"
    report = bench.report()
    reference = json.loads((bench.stage_dir / "reference" / "reference.json").read_text())
    assert report["passed"] and report["attempts"] == 1
    for row, ref in zip(report["prompts"], reference["prompts"], strict=True):
        assert row["reference_text"] == ref["text"] and row["device_text"] == ref["text"]
        assert row["agreement"] == 1.0 and not row["device_degenerate"]
    assert report["prefill"]["cosine"] > 0.99
    assert report["device"]["hailort"] == "5.3.0" and report["device"]["fake"] is True
    assert "127.0.0.1" not in json.dumps(report)  # the host never enters the report
    assert f"{VERIFY}: passed on the HailoRT TEST DOUBLE (not a device)" in first.stdout
    log = bench.log()
    assert "WARNING: the device answered as the FAKE" in log
    assert uploads_of_hef(log) == 1
    hef = next(bench.remote.glob("*/model.hef"))
    assert hef.read_bytes() == (bench.stage_dir / "compile" / "model.hef").read_bytes()

    again = bench.verify()
    assert again.returncode == 0 and again.outcomes()[VERIFY] == "uptodate"

    mtime = hef.stat().st_mtime_ns
    forced = bench.verify("-a")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert forced.outcomes()[VERIFY] == "built"
    log = bench.log()
    assert uploads_of_hef(log) == 0  # the digest-named HEF is already on the device host
    assert f"already there, sha256 verified: {hef}" in log
    assert hef.stat().st_mtime_ns == mtime


def test_interrupted_first_attempt_is_retried(bench: Bench, tmp_path: Path):
    # HEFBUILD_DEVICE points at the real one; its host key is in the known_hosts file
    bench.device(host="device.invalid", port=22,
                 known_hosts=bench.host.known_hosts(tmp_path / "known_hosts"))
    bench.fake("interrupt_once")
    run = bench.verify("-a", env={"HEFBUILD_DEVICE": bench.host.url})
    assert run.returncode == 0, run.stdout + run.stderr
    report = bench.report()
    assert report["passed"] and report["attempts"] == 2
    generate = [a for a in report["attempt_log"] if a["step"] == "generate"]
    assert [a["outcome"] for a in generate] == ["transient", "ok"]
    assert "HAILO_COMMUNICATION_CLOSED" in generate[0]["message"]
    assert "generate attempt 2/3 after" in bench.log()


def test_hang_is_killed_at_the_attempt_timeout_and_retried(bench: Bench):
    bench.device(timeout="6s", attempts=2)
    bench.fake("hang")
    run = bench.verify("-a")
    log = bench.log() if run.returncode == 0 else bench.failed_log()
    assert "generate attempt 1/2 after 0.00 s: transient (timed out after" in log
    assert "generate attempt 2/2" in log


def test_deterministic_error_is_not_retried_and_device_logs_are_fetched(bench: Bench):
    bench.fake("bad_hef")
    run = bench.verify("-a")
    assert run.returncode != 0 and run.outcomes()[VERIFY] == "failed"
    log = bench.failed_log()
    assert "attempt 1/3" in log and "attempt 2/3" not in log
    assert "deterministic" in log
    assert "device logs (fetched because the check failed)" in log
    assert "[FAKE hailort]" in log  # the client's hailort.log, copied from the device host
    assert "hailortcli logs runtime" in log
    assert "verify" in error_line(run)


def test_version_mismatch_is_refused_before_generation(bench: Bench):
    bench.fake("ok", firmware="5.2.0")
    run = bench.verify("-a")
    assert run.returncode != 0
    line = error_line(run)
    assert "version mismatch" in line and "firmware 5.2.0 (pinned 5.3.0)" in line
    log = bench.failed_log()
    assert "versions attempt 1/3" in log and "versions attempt 2/3" not in log
    assert "generate attempt" not in log


def test_degenerate_output_fails_the_check(bench: Bench):
    bench.fake("degenerate")
    run = bench.verify("-a")
    assert run.returncode != 0
    line = error_line(run)
    assert "worst prompt" in line and "degenerate" in line
    log = bench.failed_log()
    assert "[FAIL]" in log and "generate attempt 1/3" in log


@pytest.mark.device
def test_real_device(tmp_path: Path, device_store: Path):
    """The real check on a real Hailo-10H host named by HEFBUILD_DEVICE (key in
    HEFBUILD_DEVICE_KEY, python in HEFBUILD_DEVICE_PYTHON, its host key in
    HEFBUILD_DEVICE_HOST_KEY or the user's ~/.ssh/known_hosts)."""
    url = os.environ.get("HEFBUILD_DEVICE", "")
    if not url.startswith("ssh://") and url != "local":
        pytest.skip("HEFBUILD_DEVICE does not point at a real device host "
                    "(ssh://user@host:port or local)")
    project = copy_project(tmp_path / "project", device_store)
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", project.root / "models")
    tc = project.root / "toolchain/hailo10h-device.toml"
    text = tc.read_text()
    if os.environ.get("HEFBUILD_DEVICE_KEY"):
        text = text.replace('key_file = "~/.ssh/id_ed25519"',
                            f'key_file = "{os.environ["HEFBUILD_DEVICE_KEY"]}"')
    if os.environ.get("HEFBUILD_DEVICE_PYTHON"):
        text = text.replace('interpreter = "/usr/bin/python3"',
                            f'interpreter = "{os.environ["HEFBUILD_DEVICE_PYTHON"]}"')
    tc.write_text(text)
    env = {"HEFBUILD_DEVICE": url}
    if os.environ.get("HEFBUILD_DEVICE_HOST_KEY"):
        env["HEFBUILD_DEVICE_HOST_KEY"] = os.environ["HEFBUILD_DEVICE_HOST_KEY"]
    run = project.doit(VERIFY, timeout=3600, env=env)
    log_path = project.root / "build" / MODEL / ("verify/log.txt" if run.returncode == 0
                                                 else "verify.failed.log")
    log = log_path.read_text()
    assert "FAKE" not in log, "a real device run must not use the test doubles"
    assert run.returncode == 0, run.stderr
    assert json.loads((project.root / "build" / MODEL / "verify/report.json").read_text())[
        "device"]["fake"] is False
