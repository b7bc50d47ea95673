"""A recipe sweep on the cluster: three variants of the tiny hailo10h model (the Dataflow
Compiler is the test double of tests/fakes), three stages in flight at once. The stages
upstream of the overrides are built once and restored for the other variants; optimize
(gpu = true) runs on the GPU host, compile (CPU = 2) on the only node with two CPUs, and
verify (its device toolchain declares `hailo10h = 1`) on the device host, whose HailoRT is
the test double of tests/fakes (its report says so)."""

from __future__ import annotations

import json
import shutil

import pytest
from device.conftest import wrapper
from e2e.conftest import REPO, copy_project
from e2e.test_variants import MODEL, PER_VARIANT, SHARED, SWEEP, VARIANTS, names
from fakes.toolchains import FAKE_DFC_TOOLCHAIN

pytestmark = pytest.mark.e2e

# The device host runs this machine's python with the HailoRT test double on its path.
LOCAL_DEVICE = """\
[toolchain]
kind = "local"
interpreter = "{python}"
remote_dir = "{remote}"
description = "the device node of the test cluster; hailo_platform is the FAKE test double"

[pins]
hailort = "5.3.0"
firmware = "5.3.0"

[resources]
hailo10h = 1
"""


# About 35 s, kept whole: three variants' hailo chains on the cluster (fetch on the driver,
# the rest on nodes), which is what shows that the stages they share are built once.
def test_a_sweep_of_three_variants_builds_the_shared_stages_once(cluster: dict, tmp_path) -> None:  # noqa: ANN001
    project = copy_project(tmp_path / "project", tmp_path / "store")
    model = project.root / "models" / f"{MODEL}.toml"
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", model)
    model.write_text(model.read_text() + SWEEP)
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC_TOOLCHAIN)
    lines = (project.root / "data/calibration/tiny-stories.txt").read_text().splitlines()
    (project.root / "data/calibration/sweep.txt").write_text("\n".join(lines[::-1]) + "\n")
    (project.root / "hefbuild.toml").write_text(
        f'[cache]\nremote = "{cluster["cache"].url}"\n\n'
        f'[executor]\nkind = "ray"\naddress = "{cluster["address"]}"\n')

    run = project.doit("-n", "3", *(f"hef:{m}" for m in names(*VARIANTS)), timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    outcomes = run.outcomes()
    for stage in SHARED:
        got = sorted(outcomes[f"{stage}:{m}"] for m in names(*VARIANTS))
        assert got == ["built", "restored", "restored"], (stage, got)
    for stage in PER_VARIANT:
        assert [outcomes[f"{stage}:{m}"] for m in names(*VARIANTS)] == ["built"] * 3, stage
    built = [e for e in run.events if e.get("outcome") == "built"]
    assert len({e["key"] for e in built}) == len(built) == len(SHARED) + 3 * len(PER_VARIANT)

    def node(stage: str, m: str) -> str | None:
        manifest = json.loads((project.root / f"build/{m}/{stage}/manifest.json").read_text())
        return (manifest.get("ran_on") or {}).get("name") if manifest["outcome"] == "built" \
            else "restored"

    for m in names(*VARIANTS):
        assert node("optimize", m) == "gpu-node", m
        assert node("compile", m) == "cpu-node", m
        assert node("fetch", m) in (None, "restored")  # the source stage runs on the driver
    summary = next(x for x in run.stdout.splitlines() if x.startswith("hefbuild: "))
    assert "gpu-node (" in summary and "cpu-node (" in summary

    device = tmp_path / "device"
    device.mkdir()
    (device / "control.json").write_text(json.dumps(
        {"mode": "ok", "versions": {}, "state_dir": str(device / "state")}))
    (project.root / "toolchain/hailo10h-device.toml").write_text(
        LOCAL_DEVICE.format(python=wrapper(device), remote=device / "remote"))
    first = names("a")[0]
    checked = project.doit(f"verify:{first}", timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert node("verify", first) == "device-node"
    report = json.loads((project.root / f"build/{first}/verify/report.json").read_text())
    assert report["device"]["fake"] is True  # the test double answered, and says so
