"""Shared helpers of the Hailo Dataflow Compiler rules (hailo/parse, resources, optimize, compile).

Every DFC rule calls `prepare_environment(stage)` first thing in `main()`, before numpy or the
SDK is imported (this module imports neither at load time):

* `NPY_PROMOTION_STATE=legacy` (numpy >= 2 promotion breaks the DFC's `create_hw_params()`);
  set when missing; a numpy already imported without it, or another value, is a failure.
* `CUDA_VISIBLE_DEVICES` always explicit: "0" when the caller left it unset (unset, the DFC
  sets it to "99" and hides every GPU). An explicit value, even empty, is kept.
* `TRANSFORMERS_NO_TF=1`.

Then, before a HAR is loaded, `register_acceleras_layers()` registers every Keras layer class
of `hailo_model_optimization.acceleras` as Keras-serializable (an optimized HAR otherwise
fails with "Unknown layer"); a no-op where that package or Keras is absent. Before compiling,
`patch_sdk_paths()` forces the `hailo_sdk_common.paths_manager.paths.SDKPaths` singleton into
release mode with a fresh build dir (non-release installs point it at a missing directory).
`SdkLogWatch` collects what the SDK logs (its loggers and its `*.log` files in the cwd) so
optimize can fail on "Reducing optimization level" / no-GPU lines.

HAR files are tar archives; `write_har_members` / `normalize_har` rewrite them with sorted
members and fixed metadata (mtime, uid/gid, names, modes), so equal content gives equal bytes.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from common.action import fail

HW_ARCH = "hailo10h"
HAR_MTIME = 946684800  # 2000-01-01T00:00:00Z, for every member of a HAR this build writes
TAR_FORMAT = tarfile.GNU_FORMAT

# ONNX input names of the export contract -> the genai server's role names
# (`input_layers_names_suffixes` keys in hailo-config.json).
INPUT_ROLES = {
    "inputs_embeds": "embeddings",
    "attention_mask": "attention_mask",
    "cos_k": "pe_k_cos",
    "sin_k": "pe_k_sin",
    "cos_q": "pe_q_cos",
    "sin_q": "pe_q_sin",
}
RUN_CONFIG_KEYS = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "num_hidden_layers", "rope_theta", "vocab_size", "seq_len", "prefill_size", "cache_size",
    "scope", "bos_token_id", "eos_token_id", "pad_token_id", "inputs", "outputs",
)

REDUCED_OPTIMIZATION = re.compile(r"reducing optimization level", re.IGNORECASE)
NO_GPU = re.compile(r"\bno (?:available |visible )?gpus?\b|\bgpu (?:is )?not (?:available|found)",
                    re.IGNORECASE)
SDK_LOGGER_MODULES = ("hailo_sdk_common.logger.logger",
                      "hailo_model_optimization.acceleras.utils.logger")


# -- environment -----------------------------------------------------------------------

def prepare_environment(stage: str) -> None:
    """The DFC environment guards; call before numpy or hailo_sdk_client is imported."""
    state = os.environ.get("NPY_PROMOTION_STATE")
    if "numpy" in sys.modules and state != "legacy":
        fail(f"{stage}: numpy was imported before NPY_PROMOTION_STATE=legacy was set "
             f"(it is {state!r}); the DFC's quantization needs the legacy promotion")
    if state is None:
        os.environ["NPY_PROMOTION_STATE"] = "legacy"
    elif state != "legacy":
        fail(f"{stage}: NPY_PROMOTION_STATE={state!r}; the DFC needs 'legacy'")
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
    print(f"{stage}: NPY_PROMOTION_STATE=legacy "
          f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} "
          f"TRANSFORMERS_NO_TF={os.environ['TRANSFORMERS_NO_TF']}", flush=True)


def import_sdk(stage: str) -> Any:
    """The `hailo_sdk_client` module (importing it also loads its sibling packages)."""
    try:
        return importlib.import_module("hailo_sdk_client")
    except ImportError as exc:
        fail(f"{stage}: hailo_sdk_client is not importable from {sys.executable} ({exc}); "
             "install the Hailo Dataflow Compiler 5.3.0 wheel in this toolchain")


def client_runner(stage: str, **kwargs: Any) -> Any:
    return import_sdk(stage).ClientRunner(**kwargs)


def register_acceleras_layers() -> int:
    """Register every acceleras Keras layer class as Keras-serializable; returns the count."""
    import inspect
    import pkgutil

    try:
        acceleras = importlib.import_module("hailo_model_optimization.acceleras")
    except ImportError:
        return 0
    try:
        keras = importlib.import_module("keras")
    except ImportError:
        try:
            keras = importlib.import_module("tensorflow.keras")
        except ImportError:
            return 0
    saving = getattr(keras, "saving", None)
    register = getattr(saving, "register_keras_serializable", None)
    if register is None:
        register = keras.utils.register_keras_serializable
    base = keras.layers.Layer
    count = 0
    for info in pkgutil.walk_packages(acceleras.__path__, prefix=f"{acceleras.__name__}."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional backend of the SDK; its layers cannot be in a HAR
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == module.__name__ and issubclass(cls, base)
                    and getattr(cls, "_keras_api_names", None) is None):
                register()(cls)
                count += 1
    return count


def patch_sdk_paths(stage: str, work: Path) -> str | None:
    """Force the SDK's paths singleton into release mode with a fresh build dir under `work`.
    Host-side only: changes nothing in the HEF. Returns the build dir (None: no singleton)."""
    try:
        paths_module = importlib.import_module("hailo_sdk_common.paths_manager.paths")
    except ImportError:
        print(f"{stage}: note: hailo_sdk_common.paths_manager.paths not found; "
              "SDK paths patch skipped")
        return None
    sdk_paths_cls = paths_module.SDKPaths
    paths = sdk_paths_cls()
    prefix = getattr(sdk_paths_cls, "HAILO_TEMP_DIR_PREFIX", "hailo_build_")
    build_dir = tempfile.mkdtemp(prefix=str(prefix), dir=str(work))
    paths._is_release = True
    paths._build_dir = build_dir
    print(f"{stage}: SDK paths patched: release mode, build dir {build_dir}")
    return build_dir


# -- SDK log capture -------------------------------------------------------------------

class SdkLogWatch(logging.Handler):
    """Collects SDK log records (handler on its loggers) and what its `*.log` files in
    `log_dir` gained between `start()` and `stop()`."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(level=logging.DEBUG)
        self.log_dir = log_dir
        self.records: list[str] = []
        self.text = ""
        self._offsets: dict[str, int] = {}
        self._loggers: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append(record.getMessage())
        except Exception:
            self.records.append(str(record.msg))

    def start(self) -> SdkLogWatch:
        self._offsets = {p.name: p.stat().st_size for p in self.log_dir.glob("*.log")}
        loggers: dict[int, logging.Logger] = {id(logging.getLogger()): logging.getLogger()}
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith(("hailo", "acceleras")):
                logger = logging.getLogger(name)
                loggers[id(logger)] = logger
        for module_name in SDK_LOGGER_MODULES:
            module = sys.modules.get(module_name)
            candidate = getattr(module, "_g_logger", None)
            if isinstance(candidate, logging.Logger):
                loggers[id(candidate)] = candidate
        for logger in loggers.values():
            logger.addHandler(self)
            self._loggers.append(logger)
        return self

    def stop(self) -> str:
        for logger in self._loggers:
            logger.removeHandler(self)
        self._loggers = []
        chunks = list(self.records)
        for path in sorted(self.log_dir.glob("*.log")):
            with path.open("rb") as fh:
                fh.seek(self._offsets.get(path.name, 0))
                chunks.append(fh.read().decode("utf-8", errors="replace"))
        self.text = "\n".join(chunks)
        return self.text

    def findings(self) -> list[str]:
        """First log line showing reduced optimization, then first no-GPU line, if any."""
        found: list[str] = []
        for pattern in (REDUCED_OPTIMIZATION, NO_GPU):
            line = next((ln.strip() for ln in self.text.splitlines() if pattern.search(ln)),
                        None)
            if line is not None and line not in found:
                found.append(line)
        return found


# -- HAR (tar) files -------------------------------------------------------------------

def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = HAR_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def har_member_names(path: Path) -> list[str]:
    with tarfile.open(path, "r:*") as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


def read_har_member(path: Path, name: str) -> bytes:
    with tarfile.open(path, "r:*") as tar:
        handle = tar.extractfile(name)
        if handle is None:
            raise KeyError(name)
        return handle.read()


def iter_har(path: Path) -> Iterator[tuple[tarfile.TarInfo, IO[bytes]]]:
    with tarfile.open(path, "r:*") as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            handle = tar.extractfile(member)
            assert handle is not None
            yield member, handle


def write_har(dst: Path, sources: Iterable[Path], extra: dict[str, bytes] | None = None,
              drop_prefix: str | None = None) -> list[str]:
    """Write `dst` from the members of `sources` (first wins on equal names), minus names
    starting with `drop_prefix`, plus `extra`; sorted, fixed metadata. Returns the names."""
    extra = dict(extra or {})
    names: list[str] = []
    tmp = dst.with_name(f".{dst.name}.tmp")
    with tarfile.open(tmp, "w", format=TAR_FORMAT) as out:
        entries: dict[str, tuple[Path | None, int]] = {}
        for src in sources:
            with tarfile.open(src, "r:*") as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.name not in entries and m.name not in extra and not (
                            drop_prefix and m.name.startswith(drop_prefix)):
                        entries[m.name] = (src, m.size)
        for name, data in extra.items():
            entries[name] = (None, len(data))
        for name in sorted(entries):
            src, size = entries[name]
            info = _member_info(name, size)
            if src is None:
                out.addfile(info, io.BytesIO(extra[name]))
            else:
                with tarfile.open(src, "r:*") as tar:
                    handle = tar.extractfile(name)
                    assert handle is not None
                    out.addfile(info, handle)
            names.append(name)
    tmp.replace(dst)
    return names


def normalize_har(src: Path, dst: Path) -> list[str]:
    """Copy a HAR the SDK saved into `dst` with deterministic tar metadata."""
    return write_har(dst, [src])


def hn_of_har(path: Path) -> dict[str, Any]:
    """The main graph (`.hn` JSON member, not `.fp.hn` / `.native.hn`) of a HAR."""
    names = [n for n in har_member_names(path)
             if n.endswith(".hn") and not n.endswith((".fp.hn", ".native.hn"))]
    if len(names) != 1:
        raise ValueError(f"{path.name}: expected one main .hn member, found {names}")
    return json.loads(read_har_member(path, names[0]))


# -- run config and graph --------------------------------------------------------------

def load_run_config(export_dir: Path, stage: str) -> dict[str, Any]:
    path = export_dir / "run_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"{stage}: cannot read {path}: {exc}")
    missing = [k for k in RUN_CONFIG_KEYS if k not in config]
    if missing:
        fail(f"{stage}: export/run_config.json lacks {', '.join(missing)}")
    inputs = config["inputs"]
    if not isinstance(inputs, dict) or sorted(inputs) != sorted(INPUT_ROLES):
        fail(f"{stage}: export/run_config.json inputs {list(inputs)} are not the six inputs "
             f"{list(INPUT_ROLES)}")
    if not isinstance(config["outputs"], dict) or not config["outputs"]:
        fail(f"{stage}: export/run_config.json has no outputs")
    return config


def input_layers(hn: dict[str, Any], config: dict[str, Any], stage: str) -> dict[str, str]:
    """ONNX input name -> HN input layer of the base scope, by the layer's `original_names`,
    else by declaration order (input_layer1, input_layer2, ... = run_config inputs order)."""
    scope = config["scope"]
    layers = hn.get("layers", {})
    candidates = [n for n, layer in layers.items()
                  if layer.get("type") == "input_layer" and n.startswith(f"{scope}/")
                  and layer.get("io_type", "standard") != "cache"]
    names = list(config["inputs"])
    if len(candidates) != len(names):
        fail(f"{stage}: the graph has {len(candidates)} input layers in scope '{scope}' "
             f"({sorted(candidates)}); run_config declares {len(names)}")
    mapping: dict[str, str] = {}
    for layer_name in candidates:
        for original in layers[layer_name].get("original_names") or []:
            if original in config["inputs"] and original not in mapping:
                mapping[original] = layer_name
    rest_layers = sorted((n for n in candidates if n not in mapping.values()), key=natural_key)
    rest_names = [n for n in names if n not in mapping]
    mapping.update(zip(rest_names, rest_layers, strict=True))
    return {name: mapping[name] for name in names}


def natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def rope_inverse_frequencies(theta: float, head_dim: int) -> Any:
    """RoPE theta table: the head_dim/2 inverse frequencies, repeated twice (float32)."""
    import numpy as np

    half = 1.0 / (float(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    return np.concatenate([half, half]).astype(np.float32)


# -- small utilities -------------------------------------------------------------------

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def warn_if_fake_sdk(stage: str) -> None:
    """A HEF/HAR produced by the test double must never pass for a real one."""
    module = sys.modules.get("hailo_sdk_client")
    if module is not None and getattr(module, "IS_FAKE_DFC", False):
        print(f"{stage}: WARNING: hailo_sdk_client is the FAKE test double "
              f"({module.__file__}); nothing this stage writes is a real DFC result")
