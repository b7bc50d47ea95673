"""FAKE `hailo_platform`: a test double of HailoRT 5.x's Python API. NOT the real runtime.

Only importable when a test puts `tests/fakes` on the PYTHONPATH of the "device host" python.
It mimics the surface `rules/hailo/device_check.py` uses (names and signatures follow the public
`hailo_platform` package: `VDevice`, `VDevice.create_params()`, `Device.scan()`,
`Device(id).control.identify().firmware_version`, `HEF`, `VDevice.create_infer_model`,
`genai.LLM`, `HailoRTException` and its status subclasses) and runs the model for real:

The fake HEF (written by the fake DFC, tests/fakes/hailo_sdk_client) is the line `FAKE-HEF`
followed by one JSON object: `network_groups`, `net` (scope), `input_layers` {HN layer suffix:
{onnx_name, shape}}, `outputs` (ONNX output names in order), `input_layers_mapping`, and
`files` {name: base64} holding `model.onnx` (the exported graph), `external_resources.npz` (the
arrays given to add_external_resources: embedding table, RoPE theta tables and tiles),
`tokenizer.json` and `hailo-config.json`. `genai.LLM` tokenizes with `tokenizers`, looks the
embeddings up in the attached table, builds the mask and RoPE inputs (left padding, as
rules/common/hailo_inputs.py; cos/sin from the attached theta table and tiles, as the runtime
does) and runs the graph with ONNX Runtime once per generated token, greedily.

Failure injection: env FAKE_HAILO_CONTROL names a JSON file {"mode": "ok" | "interrupt_once" |
"hang" | "bad_hef" | "degenerate", "versions": {"hailort": ..., "firmware": ...},
"state_dir": ...}. Every call is logged to `hailort.log` in the directory $HAILORT_LOGGER_PATH
(default: the cwd), each line marked FAKE.
"""

from __future__ import annotations

from . import _fake
from .pyhailort.pyhailort import (
    HEF,
    ConfiguredInferModel,
    Device,
    FormatType,
    HailoCommunicationClosedException,
    HailoRTDriverOperationFailedException,
    HailoRTException,
    HailoRTInvalidHEFException,
    HailoRTTimeout,
    InferModel,
    VDevice,
)

IS_FAKE_HAILORT = True
__version__ = _fake.versions()["hailort"]

__all__ = [
    "ConfiguredInferModel", "Device", "FormatType", "HEF", "HailoCommunicationClosedException",
    "HailoRTDriverOperationFailedException", "HailoRTException", "HailoRTInvalidHEFException",
    "HailoRTTimeout", "IS_FAKE_HAILORT", "InferModel", "VDevice",
]
