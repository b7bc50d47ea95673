"""rules/hailo/device_check.py, run as the verify stage runs it on the device host: a fresh
subprocess per attempt, with PYTHONPATH=tests/fakes:rules so `hailo_platform` is the FAKE
HailoRT test double (tests/fakes/hailo_platform). Its HEF is a real fake-DFC build of
tests/hailo_models/tiny-hailo-llama.toml (fetch -> ... -> compile through doit); the double
runs that build's exported ONNX graph with ONNX Runtime, so its greedy tokens can be compared
with a float32 transformers greedy run of the same checkpoint. Nothing here is a device result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hailo_chain import MODEL, hailo_chain

np = pytest.importorskip("numpy")
pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "rules"))

from common.compare import compare_generations, is_degenerate  # noqa: E402

SCRIPT = REPO / "rules" / "hailo" / "device_check.py"
# Untrained model: "Once upon a time" streams invalid-UTF-8 byte tokens (token_ids inexact),
# "A" streams clean ones (token_ids exact); both paths are checked.
PROMPTS = ["Once upon a time", "A"]
MAX_NEW = 12


@dataclass
class Built:
    build: Path

    @property
    def hef(self) -> Path:
        return self.build / "compile" / "model.hef"

    @property
    def export(self) -> Path:
        return self.build / "export"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """tiny-hailo-llama through hef:<model> with the fake DFC: the session's build of it
    (tests/hailo_chain.py), read only."""
    built = Built(hailo_chain(tmp_path_factory) / "project" / "build" / MODEL)
    assert built.hef.read_bytes().startswith(b"FAKE-HEF\n")
    return built


@dataclass
class Answer:
    code: int
    data: dict[str, Any]
    stderr: str


class DeviceHost:
    """A scratch 'device host': its own cwd, control file, state dir and hailort.log."""

    def __init__(self, root: Path, mode: str = "ok", versions: dict | None = None):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.control = root / "control.json"
        self.control.write_text(json.dumps({"mode": mode, "state_dir": str(root / "state"),
                                            "versions": versions or {}}))
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "PYTHONPATH": os.pathsep.join([str(REPO / "tests/fakes"),
                                                   str(REPO / "rules")]),
                    "PYTHONDONTWRITEBYTECODE": "1", "FAKE_HAILO_CONTROL": str(self.control),
                    "HAILORT_LOGGER_PATH": str(root / "logs")}

    def command(self, *args: str | Path) -> list[str]:
        return [sys.executable, str(SCRIPT), *map(str, args)]

    def run(self, *args: str | Path) -> Answer:
        done = subprocess.run(self.command(*args), cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=120)
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1, (done.stdout, done.stderr[-2000:])
        return Answer(done.returncode, json.loads(lines[0]), done.stderr)

    def request(self, built: Built, prompts: list | None = None, prefill: bool = False,
                **extra: Any) -> Path:
        path = self.root / "request.json"
        npz = str(built.export / "hf_reference.npz") if prefill else None
        path.write_text(json.dumps({"prompts": prompts or PROMPTS, "max_new_tokens": MAX_NEW,
                                    "seed": 0, "prefill": {"npz": npz}, **extra}))
        return path

    def log(self) -> list[str]:
        return (self.root / "logs" / "hailort.log").read_text().splitlines()

    def logged_token_ids(self) -> list[list[int]]:
        """The ids the double generated (fake-only log detail; the genai API returns text)."""
        marker = "LLM.generate done token_ids="
        return [json.loads(ln.split(marker, 1)[1].split(" status=")[0])
                for ln in self.log() if marker in ln]


def bos_prompt(built: Built, text: str) -> str:
    """The raw prompt the server must see: it adds no BOS itself, so the BOS text leads."""
    config = json.loads((built.build / "resources" / "hailo-config.json").read_text())
    bos = config["chat_template"].split("{%", 1)[0]
    assert bos == "<s>"
    return bos + text


@pytest.fixture(scope="module")
def hf_greedy(built: Built) -> dict[str, Any]:
    """float32 transformers greedy ids for each prompt (checkpoint of the same build)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ckpt = built.build / "fetch" / "checkpoint"
    tok = transformers.AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager", local_files_only=True).eval()
    out = {}
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                                 attention_mask=torch.ones_like(ids),
                                 pad_token_id=tok.pad_token_id)
        new = [int(t) for t in gen[0, ids.shape[1]:]]
        if tok.eos_token_id in new:  # the server stops at EOS without emitting it
            new = new[: new.index(tok.eos_token_id)]
        out[text] = {"prompt_ids": [int(t) for t in ids[0]], "ids": new}
    return out


def _hef_file(built: Built, name: str) -> bytes:
    import base64

    body = json.loads(built.hef.read_bytes().split(b"\n", 1)[1])
    return base64.b64decode(body["files"][name])


def reference_pieces(built: Built, ids: list[int]) -> list[str]:
    """HF ids detokenized as the server streams them: token by token, a piece ending in U+FFFD
    held back until a printable one (the tokenizer attached to the HEF)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(_hef_file(built, "tokenizer.json").decode())
    pieces, pending = [], []
    for t in ids:
        pending.append(t)
        text = tok.decode(pending, skip_special_tokens=False)
        if not text.endswith("\ufffd"):
            pieces.append(text)
            pending = []
    if pending:
        pieces.append(tok.decode(pending, skip_special_tokens=False))
    return pieces


# -- versions --------------------------------------------------------------------------------

def test_versions_says_fake(tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host")
    answer = host.run("versions")
    assert answer.code == 0, answer.stderr
    assert answer.data["fake"] is True
    assert answer.data["hailort"] == "5.3.0" and answer.data["firmware"] == "5.3.0"
    assert answer.data["devices"] == ["0000:01:00.0"]
    assert "FAKE" in answer.data["firmware_by_device"]["0000:01:00.0"]
    assert any("control.identify" in ln and "FAKE" in ln for ln in host.log())


def test_versions_reports_a_claimed_release(tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", versions={"hailort": "5.2.0"})
    answer = host.run("versions")
    assert answer.code == 0 and answer.data["hailort"] == "5.2.0"
    assert answer.data["firmware"] == "5.3.0"


# -- audit -----------------------------------------------------------------------------------

def test_audit_accepts_the_built_hef(built: Built, tmp_path: Path) -> None:
    answer = DeviceHost(tmp_path / "host").run("audit", built.hef)
    assert answer.code == 0, answer.stderr
    data = answer.data
    assert data["ok"] is True and data["problems"] == [] and data["fake"] is True
    assert data["network_groups"] == ["model__prefill", "model__tbt"]
    prefill = [i for i in data["inputs"] if i["group"] == "model__prefill"]
    assert len(prefill) == 6
    assert data["config"]["pre_process_params"]["prefill_input_tokens_count"] == 8
    assert {"hailo-config.json", "tokenizer.json"} <= set(data["resources"])


def tamper(built: Built, dest: Path, edit: Any) -> Path:
    import base64

    head, body = built.hef.read_bytes().split(b"\n", 1)
    data = json.loads(body)
    edit(data, base64)
    dest.write_bytes(head + b"\n" + json.dumps(data).encode())
    return dest


def test_audit_rejects_an_extra_network_group(built: Built, tmp_path: Path) -> None:
    hef = tamper(built, tmp_path / "groups.hef",
                 lambda d, _: d["network_groups"].append("model"))
    answer = DeviceHost(tmp_path / "host").run("audit", hef)
    assert answer.code == 0
    assert answer.data["ok"] is False
    assert any("network groups" in p for p in answer.data["problems"])


def test_audit_rejects_the_size_key_variant(built: Built, tmp_path: Path) -> None:
    def rename(data: dict, b64: Any) -> None:
        config = json.loads(b64.b64decode(data["files"]["hailo-config.json"]))
        pre = config["pre_process_params"]
        pre["prefill_input_tokens_size"] = pre.pop("prefill_input_tokens_count")
        data["files"]["hailo-config.json"] = b64.b64encode(json.dumps(config).encode()).decode()

    hef = tamper(built, tmp_path / "key.hef", rename)
    host = DeviceHost(tmp_path / "host")
    answer = host.run("audit", hef)
    assert answer.data["ok"] is False
    problems = " ".join(answer.data["problems"])
    assert "prefill_input_tokens_count" in problems and "prefill_input_tokens_size" in problems
    # generate refuses a HEF that fails the audit, deterministically, before any generation
    failed = host.run("generate", hef, host.request(built))
    assert failed.code == 4 and failed.data["error"]["class"] == "deterministic"
    assert "audit failed" in failed.data["error"]["message"]


def test_audit_of_a_non_hef_is_a_deterministic_invalid_hef(tmp_path: Path) -> None:
    junk = tmp_path / "junk.hef"
    junk.write_bytes(b"\x00not a hef")
    answer = DeviceHost(tmp_path / "host").run("audit", junk)
    assert answer.code == 4
    assert answer.data["error"]["class"] == "deterministic"
    assert answer.data["error"]["status"] == "HAILO_INVALID_HEF"
    assert answer.data["fake"] is True


# -- generate --------------------------------------------------------------------------------

def test_generate_agrees_with_transformers_greedy(built: Built, hf_greedy: dict,
                                                  tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host")
    prompts = [bos_prompt(built, t) for t in PROMPTS]
    answer = host.run("generate", built.hef, host.request(built, prompts, prefill=True))
    assert answer.code == 0, answer.stderr
    data = answer.data
    assert data["fake"] is True and data["hailort"] == "5.3.0"
    logged = host.logged_token_ids()
    assert len(logged) == len(PROMPTS)
    exact: list[bool] = []
    for text, gen, ids in zip(PROMPTS, data["generations"], logged, strict=True):
        ref = hf_greedy[text]
        # the server tokenizes the BOS-led raw prompt exactly as HF does with its BOS
        assert gen["prompt_token_ids"] == ref["prompt_ids"]
        # the double ran the exported graph: its greedy ids ARE the float32 HF greedy ids
        assert compare_generations(ref["ids"], ids)["agreement"] == 1.0
        # what the device check can observe (text pieces) matches HF detokenized the same way
        pieces = reference_pieces(built, ref["ids"])
        assert gen["pieces"] == pieces
        assert gen["text"] == "".join(pieces)
        # token_ids come from tokenize(piece): exact where a piece maps to one id
        exact.append(gen["token_ids_exact"])
        if gen["token_ids_exact"]:
            assert gen["token_ids"] == ref["ids"]
        else:
            assert compare_generations(ref["ids"], gen["token_ids"])["agreement"] < 1.0
    assert sorted(exact) == [False, True]
    # prefill: the reference's six inputs through the __prefill group, last-position logits
    logits = np.asarray(data["prefill_logits"], dtype=np.float64)
    with np.load(built.export / "hf_reference.npz") as ref_npz:
        last = ref_npz["last_logits"].astype(np.float64)
    assert logits.shape == last.shape
    cosine = float(logits @ last / (np.linalg.norm(logits) * np.linalg.norm(last)))
    assert cosine >= 0.999
    assert data["prefill_error"] is None


def test_clear_context_makes_generation_repeatable(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host")
    prompt = bos_prompt(built, PROMPTS[0])
    answer = host.run("generate", built.hef, host.request(built, [prompt, prompt]))
    assert answer.code == 0, answer.stderr
    first, second = answer.data["generations"]
    assert first["pieces"] == second["pieces"] and first["pieces"]
    log = host.log()
    assert sum("LLM.clear_context" in ln for ln in log) == 2
    assert any('VDevice group_id="SHARED"' in ln for ln in log)


def test_context_overflow_is_deterministic(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host")
    request = host.root / "long.json"
    request.write_text(json.dumps({"prompts": ["<s>Once"], "max_new_tokens": 40, "seed": 0}))
    answer = host.run("generate", built.hef, request)
    assert answer.code == 4
    assert "context capacity 32" in answer.data["error"]["message"]


# -- failure modes ---------------------------------------------------------------------------

def test_interrupted_accept_is_transient_and_a_fresh_process_succeeds(
        built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", mode="interrupt_once")
    request = host.request(built, [bos_prompt(built, PROMPTS[0])])
    first = host.run("generate", built.hef, request)
    assert first.code == 3
    error = first.data["error"]
    assert error["class"] == "transient" and error["status"] == "HAILO_COMMUNICATION_CLOSED"
    assert "HailoCommunicationClosedException" in error["message"]
    assert first.data["fake"] is True
    second = host.run("generate", built.hef, request)
    assert second.code == 0, second.stderr
    assert second.data["generations"][0]["pieces"]
    ok = DeviceHost(tmp_path / "ok").run("generate", built.hef, request)
    assert ok.data["generations"] == second.data["generations"]


def test_bad_hef_is_deterministic(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", mode="bad_hef")
    answer = host.run("generate", built.hef, host.request(built))
    assert answer.code == 4
    assert answer.data["error"]["class"] == "deterministic"
    assert answer.data["error"]["status"] == "HAILO_HEF_FILE_CORRUPTED"


def test_version_mismatch_is_deterministic(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", versions={"hailort": "5.2.0"})
    answer = host.run("generate", built.hef, host.request(built))
    assert answer.code == 4
    assert answer.data["error"]["class"] == "deterministic"
    assert "5.2.0" in answer.data["error"]["message"]
    pinned = DeviceHost(tmp_path / "pinned")
    request = pinned.request(built, expect_versions={"hailort": "5.4.0", "firmware": "5.4.0"})
    answer = pinned.run("generate", built.hef, request)
    assert answer.code == 4 and "the build pins 5.4.0" in answer.data["error"]["message"]


def test_degenerate_output_is_reported_as_generated(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", mode="degenerate")
    answer = host.run("generate", built.hef, host.request(built, [bos_prompt(built, "Once")]))
    assert answer.code == 0  # a finished generation; judging it is the build host's job
    (ids,) = host.logged_token_ids()
    assert len(ids) == MAX_NEW and len(set(ids)) == 1 and is_degenerate(ids)
    pieces = answer.data["generations"][0]["pieces"]
    assert len(set(pieces)) == 1


def test_hang_keeps_running_until_killed(built: Built, tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host", mode="hang")
    proc = subprocess.Popen(host.command("generate", built.hef, host.request(built)),
                            cwd=host.root, env=host.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(2)
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert any("LLM.generate" in ln for ln in host.log())


def test_usage_error(tmp_path: Path) -> None:
    host = DeviceHost(tmp_path / "host")
    done = subprocess.run(host.command("generate"), cwd=host.root, env=host.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr and done.stdout == ""
