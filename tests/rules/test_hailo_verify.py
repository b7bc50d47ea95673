"""rules/hailo/verify.py and its `common.hailo_verify_*` modules against a scripted transport:
classification, retries, versions, audit, copy-by-digest, prefill figures, device logs."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "rules"))
sys.path.insert(0, str(REPO / "rules" / "hailo"))
import verify as v  # noqa: E402
from common import hailo_verify_audit as va  # noqa: E402
from common import hailo_verify_compare as vc  # noqa: E402
from common import hailo_verify_files as vf  # noqa: E402
from common import hailo_verify_logs as vl  # noqa: E402
from common import hailo_verify_retry as vr  # noqa: E402
from common.device import Completed, TransportError  # noqa: E402

TRANSIENT = Completed(3, json.dumps({"error": {"class": "transient",
                                               "status": "HAILO_COMMUNICATION_CLOSED",
                                               "message": "EINTR"}}), "", 1.0)
BAD_HEF = Completed(4, json.dumps({"error": {"class": "deterministic",
                                             "status": "HAILO_INVALID_HEF", "message": "bad"}}),
                    "", 1.0)
HUNG = Completed(-9, "", "", 5.0, timed_out=True)


def ok(data: dict) -> Completed:
    return Completed(0, "some chatter\n" + json.dumps(data) + "\n", "", 1.0)


class Scripted:
    """Answers `run` from a queue per first-argument pattern; records every call."""

    def __init__(self, answers: list, files: dict[str, str] | None = None):
        self.answers, self.files, self.log, self.calls = list(answers), files or {}, [], []

    def run(self, argv, timeout, cwd=None):
        self.calls.append(argv)
        if argv[0] == "test":
            return Completed(0 if argv[-1] in self.files else 1, "", "", 0.0)
        if argv[0] == "sha256sum":
            return Completed(0, f"{self.files.get(argv[1], '0' * 64)}  {argv[1]}\n", "", 0.0)
        if argv[0] in ("hailortcli", "cat"):
            return Completed(0, "[nnc] CHECK failed: cluster 3\n" if argv[0] == "cat" else "", "",
                             0.0)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def exists(self, remote):
        return remote in self.files

    def put(self, local, remote):
        self.log.append(f"put {local.name} -> {remote}")
        self.files[remote] = vf.sha256(local)


def device(transport, attempts=3) -> vr.Device:
    sleeps: list[float] = []
    dev = vr.Device(transport, "py", "/r", vr.Retry(attempts, 2.0, 10.0), sleep=sleeps.append,
                   rng=random.Random(0))
    dev.sleeps = sleeps
    return dev


def test_transient_is_retried_with_exponential_backoff_and_jitter():
    dev = device(Scripted([TRANSIENT, HUNG, ok({"x": 1})]))
    outcome = vr.call(dev, "generate", ["generate"])
    assert outcome.kind == "ok" and outcome.data == {"x": 1}
    assert [a["outcome"] for a in dev.attempts_log] == ["transient", "transient", "ok"]
    assert 2.0 <= dev.sleeps[0] <= 2.5 and 4.0 <= dev.sleeps[1] <= 5.0
    assert "timed out" in dev.attempts_log[1]["message"]


def test_lost_connection_is_transient():
    dev = device(Scripted([TransportError("ssh: connection reset"), ok({"y": 2})]))
    assert vr.call(dev, "versions", ["versions"]).kind == "ok"
    assert len(dev.attempts_log) == 2


def test_deterministic_error_is_not_retried():
    dev = device(Scripted([BAD_HEF, ok({})]))
    outcome = vr.call(dev, "generate", ["generate"])
    assert outcome.kind == "deterministic" and "HAILO_INVALID_HEF" in outcome.message
    assert len(dev.attempts_log) == 1 and dev.sleeps == []


def test_retries_are_bounded():
    dev = device(Scripted([TRANSIENT] * 5), attempts=2)
    with pytest.raises(vr.DeviceFailure, match="retries exhausted"):
        vr.require_ok(vr.call(dev, "generate", ["generate"]), "generation")
    assert len(dev.attempts_log) == 2


def test_a_crash_without_protocol_line_is_deterministic():
    done = Completed(1, "", "Traceback...\nImportError: no hailo_platform", 0.5)
    outcome = vr.classify(done)
    assert outcome.kind == "deterministic" and "ImportError" in outcome.message


def test_version_mismatch_is_one_clear_failure():
    dev = device(Scripted([ok({"hailort": "5.3.0", "firmware": "5.2.0", "devices": ["a"]})]))
    with pytest.raises(vr.DeviceFailure, match=r"firmware 5\.2\.0 \(pinned 5\.3\.0\)"):
        v.versions(dev, {"hailort": "5.3.0", "firmware": "5.3.0"})
    found = device(Scripted([ok({"hailort": "5.3.0", "firmware": "5.3.0", "devices": ["a"]})]))
    assert v.versions(found, {"hailort": "5.3.0", "firmware": "5.3.0"})["devices"] == 1


def test_audit_reads_groups_inputs_and_the_exact_config_key():
    run_config = {"scope": "m", "prefill_size": 8}
    good = {"ok": True, "problems": [], "network_groups": ["m__tbt", "m__prefill"],
            "inputs": [{"group": g, "name": f"{g}/in{i}"} for g in ("m__prefill", "m__tbt")
                       for i in range(6)],
            "config": {"pre_process_params": {"prefill_input_tokens_count": 8}}}
    assert va.audit_problems(good, run_config) == []
    bad = {**good, "network_groups": ["m", "m__prefill", "m__tbt"],
           "inputs": {"m__prefill": list(range(5))},
           "config": {"pre_process_params": {"prefill_input_tokens_size": 8}}}
    problems = " | ".join(va.audit_problems(bad, run_config))
    assert "expected exactly ['m__prefill', 'm__tbt']" in problems
    assert "5 inputs, expected 6" in problems
    assert "lacks prefill_input_tokens_count" in problems


def test_hef_is_copied_by_digest_once(tmp_path: Path):
    hef = tmp_path / "model.hef"
    hef.write_bytes(b"HEF bytes")
    transport = Scripted([])
    dev = device(transport)
    files = v.stage_files(dev, hef, None)
    assert files["hef"] == f"/r/{vf.sha256(hef)}/model.hef"
    assert [line for line in transport.log if "model.hef" in line] == [
        f"put model.hef -> {files['hef']}"]
    v.stage_files(dev, hef, None)
    assert sum("model.hef" in line for line in transport.log) == 1  # second time: skipped
    transport.files[files["hef"]] = "f" * 64  # corrupt on the device: copied again
    v.stage_files(dev, hef, None)
    assert sum("model.hef" in line for line in transport.log) == 2


def test_prefill_cosine(tmp_path: Path):
    logits = np.linspace(-1, 1, 50).astype(np.float32)
    np.savez(tmp_path / "ref.npz", last_logits=logits)
    same = vc.prefill_figures(tmp_path / "ref.npz", logits.tolist(), 0.9)
    assert same["passed"] and same["cosine"] == pytest.approx(1.0) and same["same_argmax"]
    flipped = vc.prefill_figures(tmp_path / "ref.npz", (-logits).tolist(), 0.9)
    assert not flipped["passed"] and flipped["cosine"] == pytest.approx(-1.0)
    skipped = vc.prefill_figures(tmp_path / "ref.npz", None, 0.9, "prefill group takes 8 tokens")
    assert skipped["passed"] is None and "8 tokens" in skipped["reason"]


def test_comparison_fails_degenerate_output_and_names_the_worst_prompt():
    reference = {"prompts": [{"prompt": "a", "token_ids": [1, 2, 3, 4], "text": "abcd"},
                             {"prompt": "b", "token_ids": [5, 6, 7, 8], "text": "efgh"}]}
    result = {"generations": [{"prompt": "a", "token_ids": [1, 2, 3, 4], "text": "abcd"},
                              {"prompt": "b", "token_ids": [9, 9, 9, 9], "text": "iiii"}]}
    rows = vc.compare_all(reference, result, 0.5)
    assert [r["passed"] for r in rows] == [True, False]
    assert rows[1]["device_degenerate"] and rows[0]["agreement"] == 1.0
    assert vc.worst_line(rows, None) == ("verify failed: worst prompt 'b': candidate output is "
                                        "degenerate (repeating loop)")


def test_device_logs_are_shown_and_the_first_check_line_returned(capsys):
    dev = device(Scripted([]))
    dev.workdir = "/r/run"
    assert vl.fetch_device_logs(dev) == "[nnc] CHECK failed: cluster 3"
    out = capsys.readouterr().out
    assert "== hailortcli logs runtime" in out and "== /r/run/hailort.log" in out


def test_a_device_divergence_at_a_float32_near_tie_is_labelled_so():
    ref = {"prompt": "a", "formatted": "<s>a", "prompt_ids": [1, 7], "token_ids": [1, 2, 3, 4],
           "margins": [3.0, 0.2, 2.5, 4.0], "text": "abcd"}
    near = vc.compare_prompt(ref, {"token_ids": [1, 9, 3, 4], "text": "aicd"}, 0.5)
    assert (near["first_divergence"], near["first_divergence_margin"], near["near_tie"]) == \
        (1, 0.2, True)
    far = vc.compare_prompt(ref, {"token_ids": [1, 2, 9, 4], "text": "abid"}, 0.5)
    assert (far["first_divergence_margin"], far["near_tie"]) == (2.5, False)
    assert (far["sent"], far["prompt_ids"]) == ("<s>a", [1, 7])  # recorded as sent
    strict = vc.compare_prompt(ref, {"token_ids": [1, 2, 9, 4], "text": "abid"}, 0.5,
                              near_tie=3.0)
    assert strict["near_tie"] is True


def test_the_summary_without_a_prefill_check_prints_the_prompts(capsys):
    rows = [{"passed": True, "agreement": 1.0, "first_divergence": None, "prompt": "a",
             "reference_text": "x", "device_text": "x", "reason": "ok"}]
    vc.summarize(rows, None, fake=False)  # prefill_check = false: no prefill figures
    out = capsys.readouterr().out
    assert "1/1 prompts passed" in out and "prefill" not in out


def test_what_verify_ships_is_the_stages_declared_code_and_all_device_check_needs():
    import ast

    from hefbuild.declare.targets import stage_defs

    code = stage_defs(REPO, "hailo10h")["verify"].code
    assert tuple(f"hailo/{name}" for name in v.DEVICE_FILES) == code
    allowed = {"__future__", "hailo_platform", "numpy"} | set(sys.stdlib_module_names)
    for name in v.DEVICE_FILES:
        tree = ast.parse((v.CHECK_DIR / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in (m.split(".")[0] for m in modules):
                # on the device host only its python's libraries and the copied files exist
                assert module in allowed or f"{module}.py" in v.DEVICE_FILES, (name, module)
