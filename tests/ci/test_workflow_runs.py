"""The shipped GitHub workflow's own commands, run as a normal user on fresh clones with
empty stores against a real nginx cache on 127.0.0.1, twice: as main (builds, checks, and
uploads signed results with a write token), then as a pull request (a new clone and store,
reading only: every stage comes from the remote, nothing is uploaded).

The steps are read from `.github/workflows/hefbuild.yml` and run as Actions would: the
workflow's, job's and step's `env:` (secrets and variables given here), `$GITHUB_ENV`
carried to later steps, `if: always()` steps after a failure. `uses:` steps are what this
machine stands in for: the checkout is the fresh clone, setup-python the system's python3,
actions/cache nothing (the store starts empty), upload-artifact a look at build/report/.
Three differences, said where they are made: bubblewrap is already installed (its step needs
sudo), pip reaches this machine's registry, not PyTorch's CPU index (no route to it), and the
pull request's install step is not run again: its clone takes main's place and main's venv.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fakes.cache_server import NginxCache

from hefbuild.remote.signing import generate

from .as_user import REPO, User, base_env, fresh_clone, python_shim

pytestmark = pytest.mark.e2e

WORKFLOW = REPO / ".github" / "workflows" / "hefbuild.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(secrets|vars)\.([A-Z_]+)\s*\}\}")
TOKEN = "ci-write-token-7d1e"
SKIPPED = {"bubblewrap"}  # installed here by .ci/setup; its step needs sudo


def substituted(value: str, given: dict[str, str]) -> str:
    out = EXPRESSION.sub(lambda m: given.get(m.group(2), ""), str(value))
    assert "${{" not in out, f"an expression this test cannot evaluate: {value}"
    return out


def env_of(table: dict | None, given: dict[str, str]) -> dict[str, str]:
    return {k: substituted(v, given) for k, v in (table or {}).items()}


def run_job(name: str, clone: Path, home: Path, user: User, given: dict[str, str],
            extra: dict[str, str], pip_cache: Path, installed: bool = False) -> dict:
    """The job's `run:` steps; `installed`: the clone has its venv already (step `install`
    is not run again)."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    job = doc["jobs"][name]
    runner = home.parent / f"runner-{name}"
    runner.mkdir()
    (runner / "env").touch()
    (runner / "summary.md").touch()
    user.owns(runner)
    env = {**base_env(home, user, python_shim(home.parent / "bin", user), pip_cache),
           **env_of(doc.get("env"), given), **env_of(job.get("env"), given),
           "CI": "true", "GITHUB_ACTIONS": "true", "RUNNER_TEMP": str(runner),
           "GITHUB_ENV": str(runner / "env"), "GITHUB_STEP_SUMMARY": str(runner / "summary.md"),
           **extra}
    env.pop("PIP_EXTRA_INDEX_URL", None)  # PyTorch's index: no route here (see above)
    ran, failed = [], False
    for step in job["steps"]:
        if "run" not in step or step.get("id") in SKIPPED | ({"install"} if installed else set()):
            continue
        if failed and step.get("if") != "always()":
            continue
        step_env = {**env, **_github_env(runner / "env"), **env_of(step.get("env"), given)}
        done = user.run(substituted(step["run"], given), clone, step_env)
        ran.append((step.get("id"), done.returncode, done.stdout + done.stderr))
        failed = failed or done.returncode != 0
    return {"steps": ran, "summary": (runner / "summary.md").read_text()}


def _github_env(path: Path) -> dict[str, str]:
    lines = [ln for ln in path.read_text().splitlines() if "=" in ln]
    return dict(ln.split("=", 1) for ln in lines)


def outcomes(clone: Path) -> dict[str, str]:
    events = [json.loads(ln) for ln in (clone / "build" / "events.jsonl").read_text()
              .splitlines()]
    return {e["task"]: e["outcome"] for e in events if "outcome" in e and "task" in e}


def assert_all_ran(job: dict) -> None:
    for step, code, output in job["steps"]:
        assert code == 0, f"step {step} exited {code}:\n{output[-3000:]}"


# The slowest test (about 3 minutes alone), kept whole on purpose: it is the shipped workflow,
# a fresh venv (pip, a minute), main building every default model from an empty store (the
# openvino toolchain's venv included), then a pull request's fresh clone reading it all.
# Split, each half would need the other's remote cache state.
def test_the_workflow_builds_and_shares_as_main_then_a_pull_request_only_reads(
        tmp_path: Path, workdir: Path, user: User, make_cache, pip_cache: Path) -> None:
    server: NginxCache = make_cache(auth=TOKEN, auth_scope="write")
    public = generate("ci-test", tmp_path / "ci.secret")
    given = {"HEFBUILD_REMOTE_CACHE": server.url, "HEFBUILD_CACHE_TOKEN": TOKEN,
             "HEFBUILD_SIGNING_KEY": (tmp_path / "ci.secret").read_text(),
             "HEFBUILD_CACHE_READ_TOKEN": ""}

    main_clone = fresh_clone(workdir / "main" / "repo", user)
    (workdir / "main" / "home").mkdir()
    user.owns(workdir / "main")
    main = run_job("main", main_clone, workdir / "main" / "home", user, given, {}, pip_cache)
    assert_all_ran(main)
    built = outcomes(main_clone)
    # All made here (a stage two models share, such as one checkpoint's fetch, is built once
    # and restored for the other).
    assert built and set(built.values()) <= {"built", "restored"}, built
    assert not any(t.endswith(":smollm2") for t in built)  # a manual model stays out
    assert "| model | target | check |" in main["summary"] and "passed" in main["summary"]
    assert (main_clone / "build" / "report" / "index.html").is_file()  # the artifact
    uploads = {p for m, p, s in server.requests() if m == "PUT" and p.startswith("/ac/")}
    keys = {json.loads((main_clone / "build" / t.split(":")[1] / t.split(":")[0] /
                        "manifest.json").read_text())["key"] for t in built}
    assert uploads == {f"/ac/{k}" for k in keys}

    # The pull request's fresh clone goes where main's was, and takes main's venv: the
    # install step is the same command on the same pins, and pip spends its 45 s here
    # compiling every module to bytecode again. Same path, so the venv's scripts and its
    # editable install point at the new clone. Its store and home are new and empty.
    main_clone.rename(workdir / "main" / "done")
    pr_clone = fresh_clone(main_clone, user)
    (workdir / "main" / "done" / ".venv").rename(pr_clone / ".venv")
    (workdir / "pr" / "home").mkdir(parents=True)
    user.owns(workdir / "pr")
    before = len(server.requests())
    # The repository's hefbuild.toml would carry trusted_keys; here the environment does:
    # the reader takes only entries main signed.
    pr = run_job("pull-request", pr_clone, workdir / "pr" / "home", user,
                 {**given, "HEFBUILD_SIGNING_KEY": "", "HEFBUILD_CACHE_TOKEN": ""},
                 {"HEFBUILD_TRUSTED_KEYS": public}, pip_cache, installed=True)
    assert_all_ran(pr)
    read = outcomes(pr_clone)
    # Nothing built: each stage from the remote (a stage two models share, once, then from
    # the local store for the other).
    assert read.keys() == built.keys() and set(read.values()) <= {"remote", "restored"}, read
    assert "remote" in read.values()
    assert [r for r in server.requests()[before:] if r[0] == "PUT"] == []
    assert "passed" in pr["summary"]


@pytest.fixture
def make_cache(tmp_path: Path):  # noqa: ANN201
    from remote.conftest import require_nginx

    require_nginx()
    made: list[NginxCache] = []

    def make(**options: object) -> NginxCache:
        cache = NginxCache(root=tmp_path / f"nginx-{len(made)}", **options)
        made.append(cache)
        return cache.start()

    yield make
    for cache in made:
        cache.stop()
