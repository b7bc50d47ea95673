"""A recipe change the emulation says reaches the gate: the costliest layer groups of the
sensitivity table (`common.hailo_fidelity_sensitivity`) promoted, w4 to a8_w8 ("8 instead of
4") and w8 to a16_w16 ("keep at 16 bit"), written as `quantization_param` lines appended to
the recipe (a later line wins), and tried in the full emulation for 1, 2, 4, ... groups until
the gate is met or the trials run out. The lines are what a user pastes into the model's
recipe; each trial parses them back from the script as optimize's output would be read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.hailo_fidelity_sensitivity import Group
from common.hailo_precision import DEFAULT, Precision, natural_order


def promoted(p: Precision) -> Precision | None:
    if p.weight_bits < 8:
        return Precision(p.activation_bits, 8)
    if p.weight_bits < 16 or p.activation_bits < 16:
        return Precision(16, 16)
    return None


def lines_for(groups: list[Group], precision: dict[str, Precision],
              mapping: dict[str, list[str]]) -> list[str]:
    """One `quantization_param` line per promoted precision, naming the DFC layers of the
    groups' nodes (in the HN's names, as the recipe's own lines do)."""
    layer_of = {onnx: layer for layer, names in mapping.items() for onnx in names}
    wanted: dict[str, list[str]] = {}
    for group in groups:
        for node in group.nodes:
            target = promoted(precision.get(node, DEFAULT))
            layer = layer_of.get(node)
            if target is not None and layer is not None:
                wanted.setdefault(target.name, []).append(layer)
    return [f"quantization_param([{', '.join(natural_order(set(layers)))}], "
            f"precision_mode={mode})"
            for mode, layers in sorted(wanted.items())]


def trial_sizes(groups: int, trials: int) -> list[int]:
    """1, 2, 4, ... up to every group, at most `trials` of them."""
    sizes, k = [], 1
    while k < groups:
        sizes.append(k)
        k *= 2
    return (sizes + [groups])[:trials] if groups else []


Emulate = Callable[[str], dict[str, Any]]  # recipe script -> the emulation's summary


def propose(ranked: list[Group], precision: dict[str, Precision], mapping: dict[str, list[str]],
            script: str, emulate: Emulate, reached: Callable[[dict[str, Any]], bool],
            trials: int) -> dict[str, Any]:
    tried = []
    for k in trial_sizes(len(ranked), trials):
        lines = lines_for(ranked[:k], precision, mapping)
        if not lines:
            continue
        summary = emulate(script.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
        tried.append({"groups": [g.name for g in ranked[:k]], "lines": lines,
                      "summary": summary, "reached": reached(summary)})
        if tried[-1]["reached"]:
            break
    best = next((t for t in tried if t["reached"]), tried[-1] if tried else None)
    return {"reached": bool(best and best["reached"]), "proposed": best, "trials": tried}
