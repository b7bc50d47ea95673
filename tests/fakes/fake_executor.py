"""A fake executor: records which rule ran and writes outputs without starting a process.

Each output's bytes are a digest of the action's stage, parameters, source, file parameter
contents and upstream output contents (never of the model name or the rule's code), so
an upstream rerun that changes nothing downstream leaves identical bytes: early cutoff
can be observed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hefbuild.digest import canonical_json
from hefbuild.execute import ExecResult, StageRun

SKIPPED_INPUTS = ("manifest.json", "log.txt")  # timings and logs never reach a rule's bytes


@dataclass
class FakeExecutor:
    fail: set[str] = field(default_factory=set)  # stages that exit 1
    omit: dict[str, str] = field(default_factory=dict)  # stage -> declared output left out
    interrupt: set[str] = field(default_factory=set)  # stages interrupted (Ctrl-C) mid-run
    ran: list[str] = field(default_factory=list)  # task names, in the order they ran
    requests: list[StageRun] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # each action.json, parsed

    def run_stage(self, request: StageRun) -> ExecResult:
        action = json.loads(request.action_json(str))
        stage = action["stage"]
        self.ran.append(f"{stage}:{action['model']}")
        self.requests.append(request)
        self.actions.append(action)
        if stage in self.interrupt:
            (Path(action["out"]) / "partial.bin").write_bytes(b"half")
            raise KeyboardInterrupt
        if stage in self.fail:
            # Like a failing verify: the report of the failed run is written, then exit 1.
            for decl in action["outputs"]:
                if decl.endswith(".json"):
                    (Path(action["out"]) / decl).write_text('{"passed": false}\n')
            request.log_path.write_text(f"{stage}: starting\n{stage}: gate failed: 0.1 < 0.5\n")
            return ExecResult(returncode=1, seconds=0.01, peak_rss_mb=10.0)
        self._write_outputs(action)
        request.log_path.write_text(f"{stage}: ok\n")
        return ExecResult(returncode=0, seconds=0.01, peak_rss_mb=10.0)

    def stages_ran(self) -> list[str]:
        return [task.split(":")[0] for task in self.ran]

    def _write_outputs(self, action: dict[str, Any]) -> None:
        out, seed = Path(action["out"]), content_seed(action)
        for decl in action["outputs"]:
            if self.omit.get(action["stage"]) == decl:
                continue
            if decl.endswith("/"):
                folder = out / decl.rstrip("/")
                folder.mkdir(parents=True)
                (folder / "config.json").write_bytes(seed + b" config")
                (folder / "weights.bin").write_bytes(seed + b" weights")
            else:
                (out / decl).write_bytes(seed + b" " + decl.encode())


def content_seed(action: dict[str, Any]) -> bytes:
    h = hashlib.sha256()
    h.update(canonical_json([action["stage"], action["params"], action["source"]]).encode())
    for name, path in sorted(action["files"].items()):
        h.update(name.encode() + Path(path).read_bytes())
    for up, folder in sorted(action["inputs"].items()):
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and path.name not in SKIPPED_INPUTS:
                h.update(f"{up}/{path.relative_to(folder)}".encode() + path.read_bytes())
    return h.hexdigest().encode()
