"""The fidelity stage's emulations, in the order that holds one set of weights at a time:
one float32 pass (calibration ranges, and the float32 logits of every context the reports
compare: computed once, then the float session is closed), then one session per emulated
recipe, its rounded weights made from the file one at a time and handed to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.hailo_fidelity_compare import contexts, evaluate, summary
from common.hailo_fidelity_graphs import Export, Feeder, Graphs, float_pass
from common.hailo_fidelity_plan import Plan, plan_precisions
from common.qdq_emulation import (
    Quant,
    activation_points,
    counts,
    fake_quantize,
    input_ranges,
    quants,
    with_fake_quant,
)


@dataclass
class Calibration:
    """Ranges over the calibration rows (float32 graph), and the float32 logits of the first
    rows (the sensitivity table's) and of every reference context."""

    rows: list[list[int]]
    inputs: dict[str, tuple[float, float]]
    acts: dict[str, tuple[float, float]]
    kept: list[Any]
    floats: dict[tuple[int, ...], Any]


def calibrate(export: Export, feeder: Feeder, rows: list[list[int]], keep: int,
              reference: dict[str, Any]) -> Calibration:
    wanted = [c for r in reference["prompts"] for c in contexts(r, feeder.seq)]
    unique = list(dict.fromkeys(tuple(c) for c in wanted))
    acts, kept, floats = float_pass(export, activation_points(export.graph),
                                    (feeder.feeds(r) for r in rows), keep,
                                    (feeder.feeds(list(c)) for c in unique))
    inputs = input_ranges((feeder.feeds(r) for r in rows), export.graph.inputs)
    return Calibration(rows, inputs, acts, kept, dict(zip(unique, floats, strict=True)))


class Emulator:
    """A recipe script emulated in full: its plan, its session, its figures per prompt."""

    def __init__(self, export: Export, feeder: Feeder, hn: Any, calibration: Calibration,
                 reference: dict[str, Any]) -> None:
        self.export, self.feeder, self.hn = export, feeder, hn
        self.calibration, self.reference = calibration, reference

    def plan(self, script: str) -> Plan:
        return plan_precisions(script, self.hn, self.feeder.config, self.export.graph)

    def rows(self, plan: Plan, enough: Callable[[dict[str, Any]], bool] | None = None
             ) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
        """Every prompt's figures, and what was quantized how. With `enough`, the free-running
        figures only when the teacher-forced summary satisfies it (a proposal's trial that
        misses its target needs no more: half the runs saved)."""
        export, cal = self.export, self.calibration
        acts, weights = plan.bits(export.graph)
        points = {t: Quant.of(acts[t], *cal.acts[t]) for t in cal.acts if t in acts}
        self.feeder.quants = quants(cal.inputs, plan.input_bits)
        arrays = {w: fake_quantize(export.weight(w), b) for w, b in sorted(weights.items())}
        session = export.session("emulation", with_fake_quant(export.model, points), arrays)
        del arrays  # the session holds them: one rounded copy of the weights, no float one
        graphs = Graphs(self.feeder, cal.floats, session, export.outputs)
        eos = self.reference.get("eos_token_id")
        prompts = self.reference["prompts"]
        rows = [evaluate(graphs, r, eos, free_running=enough is None) for r in prompts]
        if enough is not None and enough(summary(rows)):
            rows = [evaluate(graphs, r, eos) for r in prompts]  # teacher-forced: cached
        session.close()
        return rows, counts({t: acts[t] for t in points}, weights)

    def trial(self, script: str, enough: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The summary of a script's emulation (a proposal's trial); free-running figures
        only when the teacher-forced ones are `enough`."""
        return summary(self.rows(self.plan(script), enough)[0])
