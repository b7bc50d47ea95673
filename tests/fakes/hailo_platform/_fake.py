"""Machinery of the FAKE hailo_platform: control file, client log, fake-HEF container, and the
model run (ONNX Runtime on the exported graph). NOT the real runtime."""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAGIC = b"FAKE-HEF"
DEFAULT_VERSIONS = {"hailort": "5.3.0", "firmware": "5.3.0"}
MODES = ("ok", "interrupt_once", "hang", "bad_hef", "degenerate")
FAKE_DEVICE_ID = "0000:01:00.0"
# The graph's six inputs by their runtime role (hailo-config.json input_layers_names_suffixes).
ROLES = ("embeddings", "attention_mask", "pe_k_cos", "pe_k_sin", "pe_q_cos", "pe_q_sin")


def control() -> dict[str, Any]:
    path = os.environ.get("FAKE_HAILO_CONTROL")
    data: dict[str, Any] = {}
    if path:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    mode = data.get("mode", "ok")
    if mode not in MODES:
        raise ValueError(f"FAKE hailo_platform: unknown mode {mode!r} in {path}")
    return {"mode": mode, "versions": {**DEFAULT_VERSIONS, **data.get("versions", {})},
            "state_dir": data.get("state_dir")}


def versions() -> dict[str, str]:
    return control()["versions"]


def log(call: str, **fields: Any) -> None:
    """One line per call in hailort.log (dir $HAILORT_LOGGER_PATH, default cwd)."""
    folder = Path(os.environ.get("HAILORT_LOGGER_PATH") or os.getcwd())
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    detail = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in fields.items())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "hailort.log", "a", encoding="utf-8") as fh:
            fh.write(f"[{stamp}] [FAKE hailort] [pid {os.getpid()}] {call} {detail}\n")
    except OSError:
        pass


def next_attempt() -> int:
    """Count LLM creations across processes (in state_dir/attempts); 1 for the first."""
    state = control()["state_dir"]
    if not state:
        return 1
    path = Path(state) / "attempts"
    path.parent.mkdir(parents=True, exist_ok=True)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    return count


def read_container(source: str | bytes) -> dict[str, Any]:
    """The fake HEF's JSON body; ValueError when it is not one."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    if not data.startswith(MAGIC + b"\n"):
        raise ValueError("not a FAKE-HEF (the real runtime cannot load fake HEFs either)")
    body = json.loads(data.split(b"\n", 1)[1])
    if body.get("format") != "fake-hef/1":
        raise ValueError("FAKE-HEF without the fake-hef/1 payload (made by an older fake DFC)")
    return body


def file_bytes(body: dict[str, Any], name: str) -> bytes | None:
    raw = body.get("files", {}).get(name)
    return None if raw is None else base64.b64decode(raw)


def _hailo_inputs() -> Any:
    """rules/common/hailo_inputs.py (left padding, mask): from the path, else from the repo."""
    try:
        from common import hailo_inputs
    except ImportError:
        rules = Path(__file__).resolve().parents[3] / "rules"
        sys.path.append(str(rules))
        from common import hailo_inputs
    return hailo_inputs


class Model:
    """The fake HEF's graph plus what the runtime attaches: embedding table, RoPE tables,
    tokenizer and hailo-config.json."""

    def __init__(self, body: dict[str, Any]):
        import numpy as np
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.body = body
        if body.get("weights_not_kept"):  # the DFC double kept no weights: nothing to run
            raise ValueError(f"FAKE-HEF holds no model to run: {body['weights_not_kept']}")
        self.config = json.loads(file_bytes(body, "hailo-config.json") or b"{}")
        tok = file_bytes(body, "tokenizer.json")
        onnx_bytes = file_bytes(body, "model.onnx")
        resources = file_bytes(body, "external_resources.npz")
        if tok is None or onnx_bytes is None or resources is None or not self.config:
            raise ValueError("FAKE-HEF lacks model.onnx, external resources, tokenizer.json or "
                             "hailo-config.json")
        self.tokenizer = Tokenizer.from_str(tok.decode("utf-8"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(onnx_bytes, options,
                                            providers=["CPUExecutionProvider"])
        with np.load(io.BytesIO(resources)) as npz:
            arrays = {k: npz[k] for k in npz.files}
        net = body["net"]
        suffixes = self.config["input_layers_names_suffixes"]
        layers = body["input_layers"]
        self.onnx_name = {role: layers[suffixes[role]]["onnx_name"] for role in ROLES}
        self.layer_of = {role: suffixes[role] for role in ROLES}
        emb_layer = f"{net}/{suffixes['embeddings']}"
        self.embedding = arrays[f"{emb_layer}/embed"].astype(np.float32)
        self.rope = {}
        for role in ROLES[2:]:
            layer = f"{net}/{suffixes[role]}"
            theta = arrays[f"{layer}/theta"].astype(np.float32)
            tile = [int(t) for t in arrays[f"{layer}/tile"]]
            factor = float(arrays[f"{layer}/factor"][0]) if f"{layer}/factor" in arrays else 1.0
            self.rope[role] = (theta, tile[-1], factor)
        self.seq = int(self.session.get_inputs()[0].shape[1])
        pre = self.config["pre_process_params"]
        self.n_heads = int(pre["num_attention_heads"])
        self.capacity = min(self.seq, int(pre.get("kv_cache_size", self.seq)))
        stop = self.config.get("stop_token_id", [self.config.get("eos_token_id")])
        self.stop_ids = {int(s) for s in (stop if isinstance(stop, list) else [stop])
                         if s is not None}
        # Any pad row works: pad keys are blocked for every real query (left padding).
        self.pad_id = int(self.config.get("eos_token_id") or 0)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def inputs_for(self, ids: list[int]) -> dict[str, Any]:
        """The six graph inputs for `ids`, keyed by ONNX input name."""
        import numpy as np

        hi = _hailo_inputs()
        padded, n_real = hi.left_pad(ids, self.seq, self.pad_id)
        pos = hi.positions(n_real, self.seq).astype(np.float32)
        feeds = {
            self.onnx_name["embeddings"]: self.embedding[padded][None].astype(np.float32),
            self.onnx_name["attention_mask"]: hi.attention_mask(n_real, self.seq, self.n_heads),
        }
        for role, (theta, tile, factor) in self.rope.items():
            angles = (pos[:, None] * np.float32(factor)) * theta[None, :]
            table = np.cos(angles) if role.endswith("cos") else np.sin(angles)
            feeds[self.onnx_name[role]] = np.tile(table.astype(np.float32), (1, tile))[None]
        return feeds

    def run(self, feeds: dict[str, Any]) -> list[Any]:
        return self.session.run(self.outputs, feeds)

    def last_logits(self, ids: list[int]) -> Any:
        import numpy as np

        outs = self.run(self.inputs_for(ids))
        return np.concatenate([o.reshape(-1) for o in outs])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)
