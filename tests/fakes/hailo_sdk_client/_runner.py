"""FAKE `ClientRunner` of the DFC test double (see the package docstring). NOT the real SDK."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import os
import re
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

from ._calls import jsonable, record

FAKE_README = b"FAKE DFC test double output: not a Hailo archive, never a real result.\n"
AUTO_HEADER = "# FAKE DFC auto model script: not a compiler decision\n"
REDUCE_LINE = ("Reducing optimization level to 1 (the accuracy won't be optimized and "
               "compression won't be used) because there's less data than the recommended "
               "amount (1024)")
NO_GPU_LINE = "no available GPU was found; the optimization runs on the CPU"
FAKE_ONNX = "fake_model.onnx"  # HAR member <net>.fake_model.onnx: the parsed graph
FAKE_RESOURCES = "fake_external_resources.npz"  # the arrays given to add_external_resources
# A double writes only small files: above this many bytes of weights it keeps neither the
# kernels nor the graph (a 0.5B model's HARs were 4.6 GB each). Its HEF then cannot run on the
# hailo_platform double, which says so; the tiny test models stay far below.
MAX_WEIGHT_BYTES = 64 << 20
NOT_KEPT = ("FAKE DFC: the weights of this model are not kept ({size} bytes > {limit}, "
            "FAKE_DFC_MAX_WEIGHT_BYTES): a test double writes only small files")


def max_weight_bytes() -> int:
    return int(os.environ.get("FAKE_DFC_MAX_WEIGHT_BYTES", MAX_WEIGHT_BYTES))


def _sdk_logger() -> Any:
    from hailo_sdk_common.logger.logger import default_logger

    return default_logger()


def _acceleras_logger() -> Any:
    from hailo_model_optimization.acceleras.utils.logger import default_logger

    return default_logger()


def _npz_bytes(arrays: dict[str, Any]) -> bytes:
    """Like np.savez, without the clock (fixed member timestamps, sorted members)."""
    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for key in sorted(arrays):
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(arrays[key]))
            zf.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)),
                        arr.getvalue())
    return buf.getvalue()


def _hn_shape(shape: list[int]) -> list[int]:
    if len(shape) == 3:
        return [-1, 1, int(shape[1]), int(shape[2])]
    return [-1, *[int(d) for d in shape[1:]]]


def log_placement(groups: list[str]) -> None:
    """The progress lines compile logs (real DFC phrasing; contexts named after the group),
    which the heartbeat turns into a phase. They change nothing in what compile makes."""
    _sdk_logger().info("Starting Hailo allocation and compilation flow")
    for group in groups:
        _sdk_logger().info(f"Validating {group}_context_0 layer by layer")


class ClientRunner:
    def __init__(self, hw_arch: str | None = None, har: str | None = None, **kwargs: Any):
        record("ClientRunner", hw_arch=hw_arch, har=har, **kwargs)
        _sdk_logger().info("FAKE ClientRunner created")
        self.hw_arch = hw_arch or "hailo8"
        self._state = "empty"
        self._net = ""
        self._hn: dict[str, Any] = {}
        self._params: dict[str, Any] = {}
        self._scripts: list[str] = []
        self._extra: dict[str, bytes] = {}
        self._not_kept = ""  # why the weights are not kept ("" when they are)
        if har is not None:
            self._load(Path(har))

    # -- HAR I/O ------------------------------------------------------------------------

    def _load(self, path: Path) -> None:
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        if "fake_dfc.json" not in members:
            raise ValueError(f"FAKE DFC: {path} is not a HAR written by the fake DFC")
        meta = json.loads(members.pop("fake_dfc.json"))
        if meta["state"] in ("quantized", "compiled"):
            import keras

            for cls in ("HailoConv", "HailoInputLayer", "HailoCacheLayer"):
                if keras.saving.get_registered_object(f"Custom>{cls}") is None:
                    raise ValueError(f"Unknown layer: '{cls}'. Please ensure you are using a "
                                     "`keras.utils.custom_object_scope`")
        self._state, self._net = meta["state"], meta["net"]
        self._not_kept = meta.get("weights_not_kept", "")
        if self.hw_arch == "hailo8":
            self.hw_arch = meta["hw_arch"]
        self._hn = json.loads(members.pop(f"{self._net}.hn"))
        import numpy as np

        with np.load(io.BytesIO(members.pop(f"{self._net}.npz"))) as npz:
            self._params = {k: npz[k] for k in npz.files}
        self._scripts = [s for s in members.pop(f"{self._net}.alls", b"").decode().split(
            "\n#---\n") if s]
        members.pop("FAKE_DFC_README.txt", None)
        self._extra = members

    def save_har(self, path: str) -> None:
        record("save_har", path)
        members = dict(self._extra)
        members.update({
            "FAKE_DFC_README.txt": FAKE_README,
            "fake_dfc.json": json.dumps({"state": self._state, "net": self._net,
                                         "hw_arch": self.hw_arch,
                                         "weights_not_kept": self._not_kept}).encode(),
            f"{self._net}.hn": json.dumps(self._hn).encode(),
            f"{self._net}.npz": _npz_bytes(self._params),
            f"{self._net}.alls": "\n#---\n".join(self._scripts).encode(),
        })
        with tarfile.open(path, "w") as tar:
            for name, data in members.items():  # insertion order, current mtime: like an SDK
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), time.time()
                tar.addfile(info, io.BytesIO(data))

    # -- parse --------------------------------------------------------------------------

    def translate_onnx_model(self, model: str, net_name: str | None = None,
                             start_node_names: Any = None, end_node_names: Any = None,
                             net_input_shapes: dict[str, list[int]] | None = None,
                             **kwargs: Any) -> tuple[str, dict[str, Any]]:
        record("translate_onnx_model", model, net_name, start_node_names=start_node_names,
               end_node_names=end_node_names, net_input_shapes=net_input_shapes, **kwargs)
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(model).graph
        inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        inputs = [i for i in graph.input if i.name not in inits]
        shapes = dict(net_input_shapes or {})
        for name, shape in shapes.items():
            found = [i for i in inputs if i.name == name]
            if not found:
                raise ValueError(f"FAKE DFC parser: {name} is not an input of the graph")
            dims = [d.dim_value for d in found[0].type.tensor_type.shape.dim]
            if [int(x) for x in shape] != dims:
                raise ValueError(f"FAKE DFC parser: shape {shape} of {name} != ONNX {dims}")
        scope = net_name or Path(model).stem
        size, limit = sum(a.nbytes for a in inits.values()), max_weight_bytes()
        self._not_kept = NOT_KEPT.format(size=size, limit=limit) if size > limit else ""
        layers: dict[str, Any] = {}
        for k, inp in enumerate(inputs, start=1):
            dims = shapes.get(inp.name) or [d.dim_value for d in inp.type.tensor_type.shape.dim]
            layers[f"{scope}/input_layer{k}"] = {
                "type": "input_layer", "original_names": [inp.name], "input": [], "output": [],
                "input_shapes": [_hn_shape(dims)], "output_shapes": [_hn_shape(dims)]}
        convs = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in inits]
        seq = int(next(iter(shapes.values()))[1]) if shapes else 1
        for j, node in enumerate(convs, start=1):
            weight = inits[node.input[1]]
            name = f"{scope}/conv{j}"
            layers[name] = {
                "type": "conv", "original_names": [node.name], "input": [], "output": [],
                "input_shapes": [[-1, 1, seq, int(weight.shape[0])]],
                "output_shapes": [[-1, 1, seq, int(weight.shape[1])]],
                "params": {"activation": "linear"}}
            if not self._not_kept:
                self._params[f"{name}/kernel:0"] = weight.reshape(1, 1, *weight.shape)
        last = f"{scope}/conv{len(convs)}" if convs else f"{scope}/input_layer1"
        for k, out in enumerate(graph.output, start=1):
            layers[f"{scope}/output_layer{k}"] = {
                "type": "output_layer", "original_names": [out.name], "input": [last],
                "output": []}
        n_layers = sum(1 for n in convs if "k_proj" in n.name) or 1
        self._net, self._state = scope, "parsed"
        # The test double's HEF runs this graph (tests/fakes/hailo_platform): carry it along.
        if not self._not_kept:
            self._extra[f"{scope}.{FAKE_ONNX}"] = Path(model).read_bytes()
        else:
            _sdk_logger().warning(self._not_kept)
        self._hn = {"name": scope, "fake": {"transformer_layers": n_layers},
                    "net_params": {"output_layers_order": [
                        n for n in layers if layers[n]["type"] == "output_layer"]},
                    "layers": layers}
        return json.dumps(self._hn), dict(self._params)

    def get_hn_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._hn)

    def get_params(self) -> dict[str, dict[str, Any]]:
        if self._not_kept:
            raise ValueError(self._not_kept)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in self._params.items():
            layer, _, param = key.rpartition("/")
            nested.setdefault(layer, {})[param] = value
        return nested

    # -- resources ----------------------------------------------------------------------

    def add_external_resources(self, resources: dict[str, Any]) -> None:
        record("add_external_resources", resources)
        mapping = resources["input_layers_mapping"]
        for layer, kind in mapping.items():
            if self._hn["layers"].get(layer, {}).get("type") != "input_layer":
                raise ValueError(f"FAKE DFC: {layer} is not an input layer")
            if kind not in ("embedding", "cos", "sin"):
                raise ValueError(f"FAKE DFC: unknown resource kind {kind}")
        self._extra[f"{self._net}.external_resources.json"] = json.dumps(
            jsonable(resources), sort_keys=True).encode()
        arrays = {f"{layer}/{key}": value
                  for layer, weights in resources.get("weights", {}).items()
                  for key, value in weights.items()}
        if not self._not_kept:  # the embedding table: as big as a projection
            self._extra[f"{self._net}.{FAKE_RESOURCES}"] = _npz_bytes(arrays)

    def add_external_file(self, name: str, path: str) -> None:
        data = Path(path).read_bytes()
        record("add_external_file", name, path, sha256=hashlib.sha256(data).hexdigest())
        self._extra[f"{self._net}.external/{name}"] = data

    # -- model script, optimize, compile --------------------------------------------------

    def load_model_script(self, script: str) -> None:
        text = Path(script).read_text() if os.path.isfile(script) else script
        record("load_model_script", text)
        self._scripts.append(text)

    def _mapping(self) -> dict[str, str]:
        raw = self._extra.get(f"{self._net}.external_resources.json")
        return json.loads(raw)["input_layers_mapping"] if raw else {}

    def optimize(self, calib_data: dict[str, Any]) -> None:
        record("optimize", calib_data)
        import numpy as np

        if self._state != "parsed":
            raise RuntimeError(f"FAKE DFC: optimize on a {self._state} model")
        script = self._scripts[-1] if self._scripts else ""
        m = re.search(r"calibset_size=(\d+)", script)
        n = int(m.group(1)) if m else 64
        base = {k: v for k, v in self._hn["layers"].items()
                if v["type"] == "input_layer" and k.startswith(f"{self._net}/")}
        if sorted(calib_data) != sorted(base):
            raise ValueError(f"FAKE DFC: calibration keys {sorted(calib_data)} != {sorted(base)}")
        mapping = self._mapping()
        for name, array in calib_data.items():
            array = np.asarray(array)
            if array.dtype != np.float32 or array.shape[0] != n:
                raise ValueError(f"FAKE DFC: {name} {array.dtype} {array.shape}; want float32 "
                                 f"with {n} samples")
            shape = base[name]["output_shapes"][0]
            want = [n, shape[2]] if mapping.get(name) in ("cos", "sin") else [n, *shape[1:]]
            if list(array.shape) != want:
                raise ValueError(f"FAKE DFC: {name} shape {list(array.shape)} != {want}")
        if os.environ.get("FAKE_DFC_REDUCE_OPT") == "1":
            _sdk_logger().warning(REDUCE_LINE)
        hidden_gpus = os.environ.get("CUDA_VISIBLE_DEVICES") == "99"
        if os.environ.get("FAKE_DFC_NO_GPU") == "1" or hidden_gpus:
            _acceleras_logger().warning(NO_GPU_LINE)
        kv = re.search(r"set_kv_cache_global_params\((\d+),\s*(\d+)\)", script)
        if kv:
            self._duplicate_for_kv_cache()
        self._state = "quantized"

    def _duplicate_for_kv_cache(self) -> None:
        layers = self._hn["layers"]
        base = {k: v for k, v in layers.items() if k.startswith(f"{self._net}/")}
        convs = [k for k, v in base.items() if v["type"] == "conv"]
        for group in (f"{self._net}__prefill", f"{self._net}__tbt"):
            for name, layer in base.items():
                layers[f"{group}/{name.split('/', 1)[1]}"] = copy.deepcopy(layer)
            for i in range(self._hn["fake"]["transformer_layers"]):
                for kv in ("k", "v"):
                    conv = next((c for c in convs if f"layers.{i}/" in str(
                        base[c]["original_names"]) and f"{kv}_proj" in str(
                        base[c]["original_names"])), convs[0])
                    target = f"{group}/{conv.split('/', 1)[1]}"
                    layers[f"{group}/cache_input_{kv}{i}"] = {
                        "type": "input_layer", "io_type": "cache", "input": [],
                        "output": [target]}
                    layers[f"{group}/cache_output_{kv}{i}"] = {
                        "type": "output_layer", "io_type": "cache", "input": [target],
                        "output": []}

    def compile(self) -> bytes:
        record("compile")
        from hailo_sdk_common.paths_manager.paths import SDKPaths

        paths = SDKPaths()
        if not paths.is_release or not os.path.isdir(paths.build_dir):
            raise RuntimeError(f"FAKE DFC: build dir {paths.build_dir} does not exist "
                               "(non-release install)")
        if self._state != "quantized":
            raise RuntimeError(f"FAKE DFC: compile on a {self._state} model")
        script = self._scripts[-1] if self._scripts else ""
        groups = re.findall(r"^\s*(\S+)\s*=\s*network_group\(", script, flags=re.M)
        log_placement(groups or [self._net])
        if script.startswith(AUTO_HEADER):
            auto = script
        else:
            auto = AUTO_HEADER + script + "fake_placement(cluster_0, [all_layers])\n"
        self._extra[f"{self._net}.auto.alls"] = auto.encode()
        self._state = "compiled"
        body = {"fake": True, "network_groups": groups,
                "script_sha256": hashlib.sha256(script.encode()).hexdigest(),
                **self._hef_payload()}
        return b"FAKE-HEF\n" + json.dumps(body, sort_keys=True).encode()

    def _hef_payload(self) -> dict[str, Any]:
        """What the hailo_platform test double needs to run the model (see its package
        docstring for the format): the graph, the attached resources and files, and the
        input layers (HN name, ONNX name, shape) of the base scope."""
        net = self._net
        files = {name: self._extra.get(f"{net}.{member}")
                 for name, member in (("model.onnx", FAKE_ONNX),
                                      ("external_resources.npz", FAKE_RESOURCES))}
        prefix = f"{net}.external/"
        files.update({k[len(prefix):]: v for k, v in self._extra.items() if k.startswith(prefix)})
        inputs = {name.split("/", 1)[1]: {"onnx_name": layer["original_names"][0],
                                          "shape": layer.get("input_shapes", [[]])[0]}
                  for name, layer in self._hn["layers"].items()
                  if name.startswith(f"{net}/") and layer["type"] == "input_layer"}
        outputs = [self._hn["layers"][n]["original_names"][0]
                   for n in self._hn.get("net_params", {}).get("output_layers_order", [])
                   if n in self._hn["layers"]]
        return {"format": "fake-hef/1", "net": net, "hw_arch": self.hw_arch,
                "weights_not_kept": self._not_kept,
                "input_layers": inputs, "outputs": outputs,
                "input_layers_mapping": self._mapping(),
                "files": {k: base64.b64encode(v).decode() for k, v in sorted(files.items())
                          if v is not None}}
