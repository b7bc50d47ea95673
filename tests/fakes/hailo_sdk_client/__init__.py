"""FAKE `hailo_sdk_client`: a test double of the Hailo Dataflow Compiler. NOT the real SDK.

Only importable when a test puts `tests/fakes` on PYTHONPATH for a rule subprocess. It mimics
the import surface the hailo10h rules use (`ClientRunner`, `exposed_definitions.Dims`, and,
through `_siblings/`, `hailo_sdk_common` and `hailo_model_optimization.acceleras`) and records
every call as a JSON line in the file named by env FAKE_DFC_CALLS. Everything it writes is
marked fake: HAR members `fake_dfc.json` / `FAKE_DFC_README.txt`, HEF bytes starting with
`FAKE-HEF`, an `.auto.alls` whose first line says it is fake.

The fake HEF is `FAKE-HEF\n` + one JSON object: `fake`, `network_groups`, `script_sha256`
and, for the HailoRT double (tests/fakes/hailo_platform), `format` "fake-hef/1", `net`,
`input_layers`, `outputs`, `input_layers_mapping` and `files` (base64): the parsed ONNX
graph (carried through the HARs as member `<net>.fake_model.onnx`), the arrays given to
add_external_resources (`<net>.fake_external_resources.npz`) and the attached files.

Behaviours of the real SDK it reproduces (so the rules' guards are exercised):
- importing it with CUDA_VISIBLE_DEVICES unset sets it to "99" (hides every GPU), and with
  "99" optimize logs a no-GPU line;
- loading a quantized/compiled HAR fails with "Unknown layer" unless the acceleras layer
  classes were registered as Keras-serializable;
- compile fails unless the SDKPaths singleton is in release mode with an existing build dir;
- env FAKE_DFC_REDUCE_OPT=1 / FAKE_DFC_NO_GPU=1 make optimize log the real SDK's
  "Reducing optimization level ..." / "no available GPU" warnings (to its logger and its
  `hailo_sdk.client.log` / `acceleras.log` files in the cwd).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ._calls import record

IS_FAKE_DFC = True
__version__ = "0.0.0+fake"
_HERE = Path(__file__).resolve().parent

record(
    "import",
    numpy_imported="numpy" in sys.modules,
    NPY_PROMOTION_STATE=os.environ.get("NPY_PROMOTION_STATE"),
    CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES"),
    TRANSFORMERS_NO_TF=os.environ.get("TRANSFORMERS_NO_TF"),
)
if "CUDA_VISIBLE_DEVICES" not in os.environ:
    os.environ["CUDA_VISIBLE_DEVICES"] = "99"  # what the real DFC does

if str(_HERE / "_siblings") not in sys.path:
    sys.path.append(str(_HERE / "_siblings"))
if importlib.util.find_spec("keras") is None and str(_HERE / "_keras_stub") not in sys.path:
    sys.path.append(str(_HERE / "_keras_stub"))

from . import exposed_definitions  # noqa: E402
from ._runner import ClientRunner  # noqa: E402

__all__ = ["ClientRunner", "IS_FAKE_DFC", "exposed_definitions"]
