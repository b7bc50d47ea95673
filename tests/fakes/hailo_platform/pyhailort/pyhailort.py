"""FAKE `hailo_platform.pyhailort.pyhailort` (see the package docstring). NOT the real runtime.

Class and method names, signatures and the exception mapping (a `_pyhailort.HailoRTStatusException`
carrying the numeric status, re-raised as the status' Python class `from` it) follow the public
HailoRT 5.x Python binding; the behaviour behind them is the double's."""

from __future__ import annotations

import enum
import os
import time
from typing import Any

from .. import _fake
from . import _pyhailort

HAILO_UNIQUE_VDEVICE_GROUP_ID = "UNIQUE"


class HailoRTException(Exception):
    pass


class HailoRTTimeout(HailoRTException):
    pass


class HailoRTInvalidHEFException(HailoRTException):
    pass


class HailoRTNotFoundException(HailoRTException):
    pass


class HailoRTDriverOperationFailedException(HailoRTException):
    pass


class HailoCommunicationClosedException(HailoRTException):
    pass


_BY_STATUS = {
    "HAILO_INVALID_HEF": (HailoRTInvalidHEFException, "Invalid HEF. See hailort.log for more "
                          "information"),
    "HAILO_NOT_FOUND": (HailoRTNotFoundException, "Item not found. See hailort.log for more "
                        "information"),
    "HAILO_DRIVER_OPERATION_FAILED": (HailoRTDriverOperationFailedException, "Failure in "
                                      "hailort driver ioctl. run 'dmesg | grep hailo' for more "
                                      "information"),
    "HAILO_COMMUNICATION_CLOSED": (HailoCommunicationClosedException, "Communication closed "
                                   "failure. Check server-client connection"),
}


def get_status_message(status_code: int) -> str:
    return _pyhailort.get_status_message(status_code)


def _fail(status: str, detail: str) -> None:
    """Raise like the real ExceptionWrapper: the status' class, from the status exception."""
    code = _pyhailort.STATUS[status]
    _fake.log("error", status=status, code=code, detail=detail)
    cls, message = _BY_STATUS.get(status, (HailoRTException, None))
    if message is None:
        message = f"libhailort failed with error: {code} ({status})"
    raise cls(message) from _pyhailort.HailoRTStatusException(str(code))


class FormatType(enum.IntEnum):
    AUTO = 0
    UINT8 = 1
    UINT16 = 2
    FLOAT32 = 3


class _VStreamInfo:
    def __init__(self, name: str, shape: tuple[int, ...], network_name: str):
        self.name, self.shape, self.network_name = name, shape, network_name

    def __repr__(self) -> str:
        return f"VStreamInfo({self.name!r}, shape={self.shape})"


class HEF:
    """A FAKE-HEF container (see the package docstring)."""

    def __init__(self, hef_source: str | bytes):
        _fake.log("HEF", source=hef_source if isinstance(hef_source, str) else "<bytes>")
        if _fake.control()["mode"] == "bad_hef":
            _fail("HAILO_HEF_FILE_CORRUPTED", "FAKE: control mode bad_hef")
        try:
            self._body = _fake.read_container(hef_source)
        except (OSError, ValueError) as exc:
            _fail("HAILO_INVALID_HEF", f"FAKE: {exc}")
        self._path = hef_source if isinstance(hef_source, str) else None

    @property
    def path(self) -> str | None:
        return self._path

    def get_network_group_names(self) -> list[str]:
        return list(self._body.get("network_groups", []))

    def _group(self, name: str | None) -> str:
        groups = self.get_network_group_names()
        if not groups:
            _fail("HAILO_INVALID_HEF", "FAKE: no network groups")
        if not name:
            return groups[0]
        if name not in groups:
            _fail("HAILO_NOT_FOUND", f"FAKE: no network group {name}")
        return name

    def get_input_vstream_infos(self, name: str | None = None) -> list[_VStreamInfo]:
        group = self._group(name)
        return [_VStreamInfo(f"{group}/{suffix}", tuple(int(d) for d in layer["shape"][1:]),
                             group)
                for suffix, layer in self._body.get("input_layers", {}).items()]

    def get_output_vstream_infos(self, name: str | None = None) -> list[_VStreamInfo]:
        group = self._group(name)
        return [_VStreamInfo(f"{group}/output_layer{k}", (1, 1, -1), group)
                for k, _ in enumerate(self._body.get("outputs", []), start=1)]

    def get_original_names_from_vstream_name(self, vstream_name: str,
                                             network_group_name: str | None = None) -> list[str]:
        group = self._group(network_group_name)
        for suffix, layer in self._body.get("input_layers", {}).items():
            if vstream_name == f"{group}/{suffix}":
                return [layer["onnx_name"]]
        for k, out in enumerate(self._body.get("outputs", []), start=1):
            if vstream_name == f"{group}/output_layer{k}":
                return [out]
        _fail("HAILO_NOT_FOUND", f"FAKE: no vstream {vstream_name}")
        return []

    def _get_external_resource_names(self) -> list[str]:
        return sorted(n for n in self._body.get("files", {}) if n != "model.onnx")

    def _get_external_resources(self, resource_name: str) -> bytes:
        data = _fake.file_bytes(self._body, resource_name)
        if data is None or resource_name == "model.onnx":
            _fail("HAILO_NOT_FOUND", f"FAKE: no external resource {resource_name}")
        return data


class _BoardInformation:
    def __init__(self, firmware: str):
        self.firmware_version = f"{firmware} (release,app,FAKE)"
        self.device_architecture = "HAILO10H"
        self.board_name = "FAKE Hailo-10H test double"

    def __str__(self) -> str:
        return (f"Firmware Version: {self.firmware_version}\n"
                f"Device Architecture: {self.device_architecture}")


class _Control:
    def identify(self) -> _BoardInformation:
        _fake.log("control.identify")
        return _BoardInformation(_fake.versions()["firmware"])


class Device:
    @classmethod
    def scan(cls) -> list[str]:
        _fake.log("Device.scan")
        return [_fake.FAKE_DEVICE_ID]

    def __init__(self, device_id: str | None = None):
        self._device_id = device_id or _fake.FAKE_DEVICE_ID
        if self._device_id != _fake.FAKE_DEVICE_ID:
            _fail("HAILO_NOT_FOUND", f"FAKE: no device {self._device_id}")
        self._control = _Control()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *args: Any) -> bool:
        self.release()
        return False

    def release(self) -> None:
        pass

    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    def control(self) -> _Control:
        return self._control


class _VDeviceParams:
    def __init__(self) -> None:
        self.group_id = HAILO_UNIQUE_VDEVICE_GROUP_ID
        self.scheduling_algorithm = None
        self.device_count = 1


class VDevice:
    def __init__(self, params: _VDeviceParams | None = None, *, device_ids: Any = None):
        self._params = params or VDevice.create_params()
        self._creation_pid = os.getpid()
        _fake.log("VDevice", group_id=self._params.group_id)
        self._open = True

    @staticmethod
    def create_params() -> _VDeviceParams:
        return _VDeviceParams()

    def __enter__(self) -> VDevice:
        return self

    def __exit__(self, *args: Any) -> bool:
        self.release()
        return False

    def release(self) -> None:
        if self._open:
            _fake.log("VDevice.release")
        self._open = False

    def get_physical_devices_ids(self) -> list[str]:
        return [_fake.FAKE_DEVICE_ID]

    def create_infer_model(self, hef_source: str | bytes, name: str = "") -> InferModel:
        if os.getpid() != self._creation_pid:
            raise HailoRTException("InferModel can be created only from the process VDevice "
                                   "was created in.")
        _fake.log("create_infer_model", name=name)
        return InferModel(HEF(hef_source), name)


# -- InferModel (low-level) -------------------------------------------------------------------

class _Stream:
    def __init__(self, name: str, shape: tuple[int, ...]):
        self.name, self.shape = name, shape
        self.format_type = FormatType.AUTO

    def set_format_type(self, type: FormatType) -> None:  # noqa: A002 (the real signature)
        self.format_type = type


class InferModel:
    def __init__(self, hef: HEF, name: str):
        self._hef = hef
        self._group = hef._group(name)
        self._model = _fake.Model(hef._body)
        self._inputs = {i.name: _Stream(i.name, i.shape)
                        for i in hef.get_input_vstream_infos(self._group)}
        shapes = [tuple(o.shape) for o in self._model.session.get_outputs()]
        self._outputs = {f"{self._group}/output_layer{k}": _Stream(
            f"{self._group}/output_layer{k}", tuple(int(d) for d in shape[1:]))
            for k, shape in enumerate(shapes, start=1)}

    @property
    def hef(self) -> HEF:
        return self._hef

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    def input(self, name: str = "") -> _Stream:
        if name not in self._inputs:
            _fail("HAILO_NOT_FOUND", f"FAKE: no input {name}")
        return self._inputs[name]

    def output(self, name: str = "") -> _Stream:
        if name not in self._outputs:
            _fail("HAILO_NOT_FOUND", f"FAKE: no output {name}")
        return self._outputs[name]

    def configure(self) -> ConfiguredInferModel:
        _fake.log("InferModel.configure", group=self._group)
        return ConfiguredInferModel(self)


class _BoundStream:
    def __init__(self) -> None:
        self._buffer: Any = None

    def set_buffer(self, buffer: Any) -> None:
        if not buffer.flags.c_contiguous:
            raise HailoRTException("Buffer must be C_CONTIGUOUS")
        self._buffer = buffer

    def get_buffer(self, tf_format: bool | None = False) -> Any:
        return self._buffer


class _Bindings:
    def __init__(self, names_in: list[str], names_out: list[str]):
        self._in = {n: _BoundStream() for n in names_in}
        self._out = {n: _BoundStream() for n in names_out}

    def input(self, name: str = "") -> _BoundStream:
        return self._in[name]

    def output(self, name: str = "") -> _BoundStream:
        return self._out[name]


class ConfiguredInferModel:
    def __init__(self, infer_model: InferModel):
        self._im = infer_model

    def __enter__(self) -> ConfiguredInferModel:
        return self

    def __exit__(self, *args: Any) -> None:
        return None

    def create_bindings(self, input_buffers: dict | None = None,
                        output_buffers: dict | None = None) -> _Bindings:
        bindings = _Bindings(self._im.input_names, self._im.output_names)
        for name, buf in (input_buffers or {}).items():
            bindings.input(name).set_buffer(buf)
        for name, buf in (output_buffers or {}).items():
            bindings.output(name).set_buffer(buf)
        return bindings

    def run(self, bindings: list[_Bindings], timeout: int) -> None:
        import numpy as np

        model, group = self._im._model, self._im._group
        _fake.log("ConfiguredInferModel.run", group=group, timeout=timeout)
        for b in bindings:
            feeds = {}
            for onnx_input in model.session.get_inputs():
                suffix = next(s for s, layer in model.body["input_layers"].items()
                              if layer["onnx_name"] == onnx_input.name)
                buf = b.input(f"{group}/{suffix}").get_buffer()
                if buf is None:
                    _fail("HAILO_NOT_FOUND", f"FAKE: no buffer bound to {group}/{suffix}")
                feeds[onnx_input.name] = np.asarray(buf, dtype=np.float32).reshape(
                    [int(d) for d in onnx_input.shape])
            for name, value in zip(self._im.output_names, model.run(feeds), strict=True):
                out = b.output(name).get_buffer()
                if out is None:
                    _fail("HAILO_NOT_FOUND", f"FAKE: no buffer bound to {name}")
                out[...] = value.reshape(out.shape)


# -- genai LLM ---------------------------------------------------------------------------------

class LLMGeneratorCompletionStatus(enum.Enum):
    GENERATING = 0
    MAX_TOKENS_REACHED = 1
    LOGICAL_END_OF_GENERATION = 2
    ABORTED = 3


class LLMGeneratorCompletion:
    """Token texts, one read() per emitted piece (replacement characters buffered)."""

    def __init__(self, pieces: list[str], final: LLMGeneratorCompletionStatus):
        self._pieces, self._final = list(pieces), final

    def __enter__(self) -> LLMGeneratorCompletion:
        return self

    def __exit__(self, *args: Any) -> bool:
        self.release()
        return False

    def release(self) -> None:
        pass

    @property
    def generation_status(self) -> LLMGeneratorCompletionStatus:
        return LLMGeneratorCompletionStatus.GENERATING if self._pieces else self._final

    def read(self, timeout_ms: int = 10000) -> str:
        if not self._pieces:
            raise HailoRTException("FAKE: read after the end of generation")
        return self._pieces.pop(0)

    def read_all(self, timeout_ms: int = 10000) -> str:
        text = "".join(self._pieces)
        self._pieces = []
        return text

    def __iter__(self) -> LLMGeneratorCompletion:
        return self

    def __next__(self) -> str:
        if self.generation_status != LLMGeneratorCompletionStatus.GENERATING:
            raise StopIteration("Generation complete")
        return self.read()


class LLM:
    def __init__(self, vdevice: VDevice, model_path: str, lora_name: str = "",
                 optimize_memory_on_device: bool = False):
        mode = _fake.control()["mode"]
        attempt = _fake.next_attempt()
        _fake.log("LLM", hef=model_path, attempt=attempt, mode=mode)
        if mode == "interrupt_once" and attempt == 1:
            # The reported flake: EINTR during the device's accept, surfaced by HailoRT as a
            # closed communication (its retry loop does not retry it).
            _fail("HAILO_COMMUNICATION_CLOSED", "FAKE: interrupted accept (first attempt)")
        body = HEF(model_path)._body
        try:
            self._model = _fake.Model(body)
        except (KeyError, ValueError) as exc:
            _fail("HAILO_INVALID_HEF", f"FAKE: {exc}")
        self._mode = mode
        self._context: list[int] = []

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *args: Any) -> bool:
        self.release()
        return False

    def release(self) -> None:
        _fake.log("LLM.release")

    def _prompt_ids(self, prompt: str | list) -> list[int]:
        if isinstance(prompt, str):
            return self._model.encode(prompt)
        if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
            raise HailoRTException("prompt must be a list of dicts in chat format")
        import jinja2

        template = jinja2.Environment().from_string(self._model.config["chat_template"])
        return self._model.encode(template.render(messages=prompt, add_generation_prompt=True))

    def generate(self, prompt: str | list, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None,
                 frequency_penalty: float | None = None, max_generated_tokens: int | None = None,
                 do_sample: bool | None = None, seed: int | None = None) -> LLMGeneratorCompletion:
        import numpy as np

        model = self._model
        params = {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                  "frequency_penalty": frequency_penalty, "do_sample": do_sample, "seed": seed,
                  "max_generated_tokens": max_generated_tokens}
        _fake.log("LLM.generate", **params)
        if do_sample:
            _fail("HAILO_NOT_SUPPORTED", "FAKE: only greedy decoding (do_sample=False)")
        if self._mode == "hang":
            while True:
                time.sleep(3600)
        if max_generated_tokens is None:
            defaults = model.config.get("default_generation_params", {})
            max_generated_tokens = int(defaults.get("max_new_tokens", 64))
        ids = self._context + self._prompt_ids(prompt)
        generated: list[int] = []
        final = LLMGeneratorCompletionStatus.MAX_TOKENS_REACHED
        for _ in range(int(max_generated_tokens)):
            if len(ids) + 1 > model.capacity:
                _fail("HAILO_NOT_SUPPORTED", f"FAKE: context of {len(ids) + 1} tokens "
                      f"exceeds the graph's {model.capacity}")
            if self._mode == "degenerate" and generated:
                token = generated[0]
            else:
                token = int(np.argmax(model.last_logits(ids)))
            if token in model.stop_ids:
                final = LLMGeneratorCompletionStatus.LOGICAL_END_OF_GENERATION
                break
            generated.append(token)
            ids.append(token)
        self._context = ids
        pieces: list[str] = []
        pending: list[int] = []
        for token in generated:  # token by token, as the server detokenizes
            pending.append(token)
            text = model.decode(pending)
            if text.endswith("\ufffd"):
                continue  # buffered until a printable character arrives
            pieces.append(text)
            pending = []
        if pending:
            pieces.append(model.decode(pending))
        # The generated ids, for tests only: the genai API itself returns text.
        _fake.log("LLM.generate done", token_ids=generated, status=final.name)
        return LLMGeneratorCompletion(pieces, final)

    def generate_all(self, prompt: str | list, temperature: float | None = None,
                     top_p: float | None = None, top_k: int | None = None,
                     frequency_penalty: float | None = None,
                     max_generated_tokens: int | None = None, do_sample: bool | None = None,
                     seed: int | None = None, timeout_ms: int = 600000) -> str:
        with self.generate(prompt, temperature, top_p, top_k, frequency_penalty,
                           max_generated_tokens, do_sample, seed) as completion:
            return completion.read_all(timeout_ms)

    def tokenize(self, text: str) -> list[int]:
        return self._model.encode(text)

    def clear_context(self) -> None:
        _fake.log("LLM.clear_context")
        self._context = []

    def get_context_usage_size(self) -> int:
        return len(self._context)

    def max_context_capacity(self) -> int:
        return self._model.capacity

    def prompt_template(self) -> str:
        return str(self._model.config.get("chat_template", ""))
