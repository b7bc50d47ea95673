"""A recipe change the emulation says reaches the gate: what the sensitivity table
(`common.hailo_fidelity_sensitivity`) ranks costliest, promoted, written as
`quantization_param` lines appended to the recipe (a later line wins). A group's activations
promote its layers (`Reach.activation_layers`) to a16_w16; its weights promote the layers of
its MatMuls w4 -> a8_w8 ("8 instead of 4"), w8 -> a16_w16 ("keep at 16 bit").

The search, in at most `trials` full emulations: first every layer the HN maps at a16_w16 (the
most lines can do: when that misses the target, no promotion reaches it, and the report says
so with that figure); then the k costliest rows of the table for k = 1, 2, 4, ... until one
reaches, then halving the gap between the largest k known to miss and the smallest known to
reach. The proposal is the smallest k that reached (else the all-a16 trial). The lines are
what a user pastes into the model's recipe; each trial parses them back from the script as
optimize's output would be read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.hailo_fidelity_sensitivity import Reach, layer_precision
from common.hailo_precision import Precision, natural_order

A16_W16 = Precision(16, 16)


def promoted(p: Precision) -> Precision | None:
    if p.weight_bits < 8:
        return Precision(p.activation_bits, 8)
    if p.weight_bits < 16 or p.activation_bits < 16:
        return A16_W16
    return None


def targets(rows: list[dict[str, Any]], reaches: dict[str, Reach],
            precision: dict[str, Precision], mapping: dict[str, list[str]]
            ) -> dict[str, Precision]:
    """DFC layer -> the precision the chosen table rows promote it to."""
    wanted: dict[str, Precision] = {}

    def lift(layer: str, to: Precision) -> None:
        old = wanted.get(layer, to)
        wanted[layer] = Precision(max(old.activation_bits, to.activation_bits),
                                  max(old.weight_bits, to.weight_bits))

    for row in rows:
        reach = reaches[row["group"]]
        if row["kind"] == "activations":
            for layer in reach.activation_layers:
                lift(layer, A16_W16)
            continue
        for layer in reach.weight_layers:
            to = promoted(layer_precision(layer, mapping, precision))
            if to is not None:
                lift(layer, to)
    return wanted


def lines_for(wanted: dict[str, Precision]) -> list[str]:
    """One `quantization_param` line per precision, naming the DFC layers (in the HN's names,
    as the recipe's own lines do)."""
    by_mode: dict[str, list[str]] = {}
    for layer, p in wanted.items():
        by_mode.setdefault(p.name, []).append(layer)
    return [f"quantization_param([{', '.join(natural_order(layers))}], precision_mode={mode})"
            for mode, layers in sorted(by_mode.items())]


def search(n: int, trials: int, reaches_at: Callable[[int], bool]) -> list[int]:
    """The prefix sizes tried, in order, by the search the module docstring describes;
    `reaches_at(0)` is the all-a16 trial."""
    if trials <= 0 or n == 0:
        return []
    tried = [0]
    if not reaches_at(0):
        return tried
    lo, hi, k = 0, None, 1
    while len(tried) < trials and hi is None and lo < n:
        k = min(k, n)
        tried.append(k)
        if reaches_at(k):
            hi = k
        else:
            lo, k = k, k * 2
    while len(tried) < trials and hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        tried.append(mid)
        if reaches_at(mid):
            hi = mid
        else:
            lo = mid
    return tried


Emulate = Callable[[str], dict[str, Any]]  # recipe script -> the emulation's summary


def propose(costs: list[dict[str, Any]], reaches: dict[str, Reach],
            precision: dict[str, Precision], mapping: dict[str, list[str]], script: str,
            emulate: Emulate, reached: Callable[[dict[str, Any]], bool],
            trials: int, layers: list[str]) -> dict[str, Any]:
    """`layers`: every DFC layer that maps to an ONNX node or graph input (the all-a16 trial)."""
    every = dict.fromkeys(layers, A16_W16)
    tried: list[dict[str, Any]] = []

    def reaches_at(k: int) -> bool:
        wanted = every if k == 0 else targets(costs[:k], reaches, precision, mapping)
        lines = lines_for(wanted)
        summary = emulate(script.rstrip("\n") + "\n" + "\n".join(lines) + "\n") if lines \
            else {}
        tried.append({"promoted": "every layer at a16_w16" if k == 0 else
                      [f"{r['group']} {r['kind']}" for r in costs[:k]],
                      "lines": lines, "summary": summary, "reached": reached(summary)})
        return tried[-1]["reached"]

    search(len(costs), trials, reaches_at)
    hits = [t for t in tried[1:] if t["reached"]]
    best = min(hits, key=lambda t: len(t["promoted"])) if hits else (tried[0] if tried else None)
    return {"reached": bool(best and best["reached"]),
            "all_a16_reaches": tried[0]["reached"] if tried else None,
            "proposed": best, "trials": tried}
