"""What a Dataflow Compiler stage is doing, read from its log lines: a pure table of patterns.

The heartbeat names the latest phase a stage's log announced (`phase: placement of
model__prefill (since 42 min)`), so a compile that has been quiet for an hour can be
told apart from one that hangs. Lines that match nothing leave the phase as it was.

Where the phrasings come from (public DFC 3.x/5.x console logs quoted in GitHub issues and
write-ups, e.g. hailo-ai/Hailo-Application-Code-Examples#280 and hailo_model_zoo issues;
HAILO-PIPELINE.md for the Hailo-10H flow):

    [info] Translation started on ONNX model <net>                       parsing
    [info] Starting Model Optimization / Starting Mixed Precision /
           Starting Fine Tune / Starting Layer Noise Analysis            optimization
    [info] Starting Stats Collector
    [info] Using dataset with 64 entries for calibration
    Calibration: 45%|####      | 29/64                                  calibration
    [info] Model Optimization is done
    [info] Starting Hailo allocation and compilation flow                compilation
    [info] Trying to compile the network in a single context
    [info] Using Multi-context flow
    [info] Finding the best partition to contexts...                     partition search
    [info] Iteration #33 - 3 contexts      (also: Iteration #5 - Contexts: 4)
    [info] Applying selected partition to 7 contexts...
    [info] Validating layers feasibility
    Validating <net>_context_0 layer by layer (100%)
    [info] Running resources allocation (mapping) flow, time per context: 59m 59s
           (older releases: Solving the allocation (Mapping), time per context: ...)
    Context:0/3 Iteration 4: Trying parallel mapping...                  allocation
    [info] Successful Mapping (allocation time: 47m 14s)
    [info] Compiling kernels of <net>_context_0...
    [info] Building HEF...
    [info] Successful Compilation (compilation time: 22s)

Not found in a public log, so matched loosely: "Successful Context_0 Allocation" and the
allocation "bucket" lines that issue 12 names. The Hailo-10H LLM flow compiles two network
groups, `<scope>__prefill` and `<scope>__tbt` (HAILO-PIPELINE.md); that their contexts are
named `<group>_context_<n>` is inferred from the `<net>_context_<n>` naming above. A line
that names a group while placing it starts "placement of <group>", and the placement steps
after it (partition, validation, allocation) stay under that group until the next phase.
Our own rules' lines ("parse: translating ...", "compile: compiling ...") count too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEMENT = "placement of "


@dataclass(frozen=True)
class Phase:
    name: str
    detail: str = ""  # the step within the phase; a new detail does not restart the clock

    @property
    def text(self) -> str:
        return f"{self.name}, {self.detail}" if self.detail else self.name


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    name: str
    detail: str = ""  # a format string over the pattern's named groups
    step: bool = False  # a step of placement: stays under the network group being placed


def _rule(pattern: str, name: str, detail: str = "", step: bool = False) -> _Rule:
    return _Rule(re.compile(pattern, re.IGNORECASE), name, detail, step)


WORDS = ("algo", "flow")  # captured prose, shown in lower case (names are shown as logged)
CALIBRATION = "statistics collection (calibration)"
PARTITION = "partition search"
FEASIBILITY = "layer feasibility"
ALLOCATION = "allocation (mapping)"

# First match wins, so the specific lines come before the general ones.
RULES: tuple[_Rule, ...] = (
    _rule(r"Translation started on ONNX model (?P<net>\S+)", "parsing", "{net}"),
    _rule(r"^\S+: translating (?P<file>\S+)", "parsing", "{file}"),
    _rule(r"Starting Stats Collector", CALIBRATION),
    _rule(r"Using dataset with (?P<n>\d+) entries for calibration", CALIBRATION, "{n} entries"),
    _rule(r"^Calibration:\s*(?P<pct>\d+)%", CALIBRATION, "{pct}%"),
    _rule(r"Starting (?P<algo>Mixed Precision|Fine Tune|Quantization-Aware Fine-Tuning|"
          r"Bias Correction|Adaround|Layer Noise Analysis|Equalization)",
          "optimization", "{algo}"),
    _rule(r"Starting Model Optimization", "optimization"),
    _rule(r"Model Optimization is done", "optimization done"),
    _rule(r"Starting Hailo allocation and compilation flow", "compilation"),
    _rule(r"^\S+: compiling\b", "compilation"),
    _rule(r"Trying to compile the network in a single context", "compilation",
          "single-context attempt", step=True),
    _rule(r"Using (?P<flow>Multi|Single)-context flow", "compilation", "{flow}-context flow",
          step=True),
    _rule(r"Finding the best partition to contexts", PARTITION, step=True),
    _rule(r"Iteration #(?P<it>\d+) - (?:Contexts: )?(?P<n>\d+)", PARTITION,
          "iteration {it}, {n} contexts", step=True),
    _rule(r"Applying selected partition to (?P<n>\d+) contexts", PARTITION,
          "applying {n} contexts", step=True),
    _rule(r"Validating layers feasibility", FEASIBILITY, step=True),
    _rule(r"Validating (?P<ctx>\S+) layer by layer", FEASIBILITY, "{ctx}", step=True),
    _rule(r"(?:Running resources allocation|Solving the allocation) \(mapping\)", ALLOCATION,
          step=True),
    _rule(r"Context:\s*(?P<c>\d+)/(?P<n>\d+) Iteration (?P<it>\d+)", ALLOCATION,
          "context {c}/{n}, iteration {it}", step=True),
    _rule(r"Successful Context[_ ]?(?P<c>\d+) Allocation", ALLOCATION,
          "context {c} allocated", step=True),
    _rule(r"\bbucket\s*#?\s*(?P<b>\d+)", ALLOCATION, "bucket {b}", step=True),
    _rule(r"Successful Mapping", "allocation done", step=True),
    _rule(r"Compiling kernels of (?P<ctx>[^.\s]+)", "kernel compilation", "{ctx}"),
    _rule(r"Building HEF", "building HEF"),
    _rule(r"Successful Compilation", "compilation done"),
)

# Every rule's line holds one of these words: one search rejects the other lines (most of
# a log: epochs, layer listings) at a fraction of the table's cost.
KEYWORDS = ("translat", "starting", "dataset", "calibration", "optimization", "compil",
            "context", "partition", "iteration", "validating", "allocation", "mapping",
            "bucket", "building hef", "__prefill", "__tbt")
# `<scope>__prefill` / `<scope>__tbt`, and the context of it a line names.
GROUP = re.compile(r"(?<![\w.-])(?P<group>[\w.-]+?__(?:prefill|tbt))(?:_context_(?P<ctx>\d+))?")
# A line about placing a group, not one that merely names it (e.g. a layer listing).
PLACING = re.compile(r"context|validat|alloc|mapping|placement|partition|kernel|compil",
                     re.IGNORECASE)


def line_phase(line: str) -> tuple[Phase, bool] | None:
    """The phase one log line announces, and whether it is a step of placement."""
    for rule in RULES:
        m = rule.pattern.search(line)
        if m:
            values = {k: (v or "").lower() if k in WORDS else (v or "")
                      for k, v in m.groupdict().items()}
            return Phase(rule.name, rule.detail.format(**values)), rule.step
    return None


def group_phase(line: str) -> Phase | None:
    """The phase `placement of <group>`, when the line is about placing a network group."""
    m = GROUP.search(line)
    if m is None or not PLACING.search(line):
        return None
    return Phase(PLACEMENT + m["group"], f"context {m['ctx']}" if m["ctx"] else "")


def next_phase(current: Phase | None, line: str) -> Phase | None:
    """The phase after `line`: `current` when the line announces nothing."""
    low = line.lower()
    if not any(word in low for word in KEYWORDS):
        return current
    placing = group_phase(line)
    if placing is not None:
        return placing
    found = line_phase(line)
    if found is None:
        return current
    phase, step = found
    if step and current is not None and current.name.startswith(PLACEMENT):
        return Phase(current.name, phase.text)
    return phase
