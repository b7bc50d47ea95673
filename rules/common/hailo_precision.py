"""The precisions a rendered DFC model script asks for, mapped onto the exported ONNX graph
(pure Python: the fidelity stage's reading of optimize's `model_script.alls`).

Lines read: `quantization_param(<target>, precision_mode=a<A>_w<W>[, ...])`, where the target
is a layer list `[model/conv1, model/conv2]`, a single name, or a DFC glob in braces
(`{model/conv*}`, matched against full layer names and against the name after the scope).
A later line overrides an earlier one for the same layer, as the script is read in order.
Other commands (and other arguments of these lines) change no precision and are ignored.
Every layer no line names stays at the DFC default, a8_w8.

A DFC layer maps to the ONNX graph by its HN `original_names` (the ONNX nodes or graph inputs
it was translated from), in the quantized HAR's graph: the base scope `<scope>/...`, else the
same layer in `<scope>__prefill/` or `<scope>__tbt/`. When the HN carries no original names at
all, the base scope's conv layers are matched in order with the graph's MatMul nodes that
have a constant weight, and its input layers with the graph inputs (both sides in graph
order), when both counts agree; otherwise nothing is mapped. What cannot be mapped is
reported as such, never guessed.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LINE = re.compile(r"^quantization_param\((?P<body>.*)\)$")
MODE = re.compile(r"\bprecision_mode\s*=\s*(?P<mode>[A-Za-z0-9_]+)")
BITS = re.compile(r"^a(?P<a>\d+)_w(?P<w>\d+)$")
ACTIVATION_BITS = (8, 16)
WEIGHT_BITS = (4, 8, 16)


@dataclass(frozen=True, order=True)
class Precision:
    activation_bits: int
    weight_bits: int

    @property
    def name(self) -> str:
        return f"a{self.activation_bits}_w{self.weight_bits}"


DEFAULT = Precision(8, 8)


@dataclass(frozen=True)
class Line:
    text: str
    targets: tuple[str, ...]
    glob: bool
    precision: Precision | None  # None: a mode this emulation does not know


@dataclass
class Resolved:
    """Per DFC layer the precision the script gives it, and what could not be resolved."""

    layers: dict[str, Precision]
    unmatched: list[str]  # targets no layer of the graph answers to
    unsupported: list[str]  # lines whose precision_mode is not a<8|16>_w<4|8|16>


def parse(script: str) -> list[Line]:
    """The script's quantization_param lines that set a precision_mode, in order."""
    lines = []
    for raw in script.splitlines():
        text = raw.strip()
        match = LINE.match(text)
        mode = MODE.search(text)
        if match is None or mode is None:
            continue
        targets, glob = _targets(match["body"])
        lines.append(Line(text, targets, glob, _precision(mode["mode"])))
    return lines


def _targets(body: str) -> tuple[tuple[str, ...], bool]:
    first = body.split("precision_mode", 1)[0].strip().rstrip(",").strip()
    if first.startswith("{") and first.endswith("}"):
        return (first[1:-1].strip(),), True
    names = first.strip("[]")
    return tuple(n.strip() for n in names.split(",") if n.strip()), False


def _precision(mode: str) -> Precision | None:
    bits = BITS.match(mode)
    if bits is None:
        return None
    a, w = int(bits["a"]), int(bits["w"])
    return Precision(a, w) if a in ACTIVATION_BITS and w in WEIGHT_BITS else None


def resolve(lines: Iterable[Line], layer_names: Iterable[str], scope: str) -> Resolved:
    """Apply the lines, in order, to the graph's base-scope layer names."""
    known = sorted(layer_names)
    result = Resolved({}, [], [])
    for line in lines:
        if line.precision is None:
            result.unsupported.append(line.text)
            continue
        for target in line.targets:
            hits = _glob(target, known, scope) if line.glob else (
                [target] if target in known else [])
            if not hits:
                result.unmatched.append(target)
            for layer in hits:
                result.layers[layer] = line.precision
    return result


def _glob(pattern: str, names: list[str], scope: str) -> list[str]:
    prefix = f"{scope}/"
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)
            or n.startswith(prefix) and fnmatch.fnmatchcase(n[len(prefix):], pattern)]


# -- the HN side ---------------------------------------------------------------------------

def base_layers(hn: dict[str, Any], scope: str) -> dict[str, dict[str, Any]]:
    """HN layers a script line can name: the base scope, else the prefill copy renamed back
    (a quantized HAR may keep only the duplicated scopes)."""
    layers = hn.get("layers", {})
    for prefix in (f"{scope}/", f"{scope}__prefill/", f"{scope}__tbt/"):
        found = {f"{scope}/{n[len(prefix):]}": layer for n, layer in layers.items()
                 if n.startswith(prefix) and layer.get("io_type", "standard") != "cache"}
        if found:
            return found
    return {}


def onnx_names(layers: dict[str, dict[str, Any]], constant_matmuls: list[str],
               graph_inputs: list[str]) -> tuple[dict[str, list[str]], str]:
    """DFC layer -> the ONNX nodes / graph inputs it was made from, and how that was found
    ("original_names", "order" or "none")."""
    if any(layer.get("original_names") for layer in layers.values()):
        return {name: list(layer.get("original_names") or [])
                for name, layer in layers.items()}, "original_names"
    mapping: dict[str, list[str]] = {}
    for kind, onnx in (("conv", constant_matmuls), ("input_layer", graph_inputs)):
        named = sorted((n for n, layer in layers.items() if layer.get("type") == kind),
                       key=_natural)
        if not named or len(named) != len(onnx):
            return {}, "none"
        mapping.update({n: [o] for n, o in zip(named, onnx, strict=True)})
    return mapping, "order"


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def natural_order(names: Iterable[str]) -> list[str]:
    """conv3 before conv12, as the DFC numbers its layers."""
    return sorted(names, key=_natural)
