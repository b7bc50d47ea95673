"""The hailo10h target's declared phase table (its `[watch]`, matched by
hefbuild.declare.phases) against Dataflow Compiler log lines as they appear in public DFC
console logs, and against our own rules' lines; and the loading of such a table."""

from __future__ import annotations

import pytest

from hefbuild.declare import phases
from hefbuild.declare.phases import Phase
from hefbuild.declare.targets import BUILTIN_TARGETS, load_target
from hefbuild.errors import SpecError

TABLE = load_target(BUILTIN_TARGETS / "hailo10h.toml").phases


def next_phase(current: Phase | None, line: str) -> Phase | None:
    return phases.next_phase(TABLE, current, line)

CASES = [
    ("[info] Translation started on ONNX model tiny_llama", "parsing, tiny_llama"),
    ("parse: translating model.onnx as 'tiny' with inputs [...]", "parsing, model.onnx"),
    ("[info] Starting Model Optimization", "optimization"),
    ("[info] Starting Mixed Precision", "optimization, mixed precision"),
    ("[info] Starting Stats Collector", "statistics collection (calibration)"),
    ("[info] Using dataset with 64 entries for calibration",
     "statistics collection (calibration), 64 entries"),
    ("Calibration:  45%|████▌     | 29/64 [00:07<00:08,  4.08entries/s]",
     "statistics collection (calibration), 45%"),
    ("[info] Starting Fine Tune", "optimization, fine tune"),
    ("[info] Model Optimization is done", "optimization done"),
    ("compile: compiling (placement search can take hours on deep models)", "compilation"),
    ("[info] Starting Hailo allocation and compilation flow", "compilation"),
    ("[info] Trying to compile the network in a single context",
     "compilation, single-context attempt"),
    ("[info] Using Multi-context flow", "compilation, multi-context flow"),
    ("[info] Finding the best partition to contexts...", "partition search"),
    ("[info] Iteration #33 - 3 contexts", "partition search, iteration 33, 3 contexts"),
    ("[info] Iteration #5 - Contexts: 4", "partition search, iteration 5, 4 contexts"),
    ("[info] Applying selected partition to 7 contexts...",
     "partition search, applying 7 contexts"),
    ("[info] Validating layers feasibility", "layer feasibility"),
    ("[info] Running resources allocation (mapping) flow, time per context: 59m 59s",
     "allocation (mapping)"),
    ("[info] Solving the allocation (Mapping), time per context: 59m 59s", "allocation (mapping)"),
    ("Context:0/3 Iteration 4: Trying parallel mapping...",
     "allocation (mapping), context 0/3, iteration 4"),
    ("[info] Successful Context_0 Allocation", "allocation (mapping), context 0 allocated"),
    ("Allocating bucket #3 of 8", "allocation (mapping), bucket 3"),  # phrasing unverified
    ("[info] Successful Mapping (allocation time: 47m 14s)", "allocation done"),
    ("[info] Compiling kernels of yolov11m_context_0...", "kernel compilation, yolov11m_context_0"),
    ("[info] Building HEF...", "building HEF"),
    ("[info] Successful Compilation (compilation time: 22s)", "compilation done"),
    # The test double's own lines (tests/fakes/hailo_sdk_client, logged as [INFO]).
    ("[INFO] Validating tiny__prefill_context_0 layer by layer",
     "placement of tiny__prefill, context 0"),
    ("[info] Compiling kernels of smollm2__tbt_context_3...",
     "placement of smollm2__tbt, context 3"),
]


@pytest.mark.parametrize(("line", "phase"), CASES)
def test_a_dfc_line_names_its_phase(line: str, phase: str):
    found = next_phase(None, line)
    assert found is not None and found.text == phase


@pytest.mark.parametrize("line", [
    "Epoch 1/4", "[info] conv65: Pass", "[warning] Dataset is larger than expected size",
    "loading", "compile: 32 cache inputs, 32 cache outputs (expected 16 each for 4 layers)",
    "model__prefill/conv1 a8_w4",  # names a group, but is not placing it
])
def test_other_lines_keep_the_phase(line: str):
    current = Phase("partition search", "iteration 3, 2 contexts")
    assert next_phase(current, line) is current
    assert next_phase(None, line) is None


def test_placement_steps_stay_under_the_group_being_placed():
    phase = next_phase(None, "[info] Validating m__tbt_context_0 layer by layer")
    phase = next_phase(phase, "[info] Running resources allocation (mapping) flow")
    assert phase == Phase("placement of m__tbt", "allocation (mapping)")
    phase = next_phase(phase, "Context:1/2 Iteration 0: Trying parallel splits...")
    assert phase.text == "placement of m__tbt, allocation (mapping), context 1/2, iteration 0"
    phase = next_phase(phase, "[info] Validating m__prefill_context_0 layer by layer")
    assert phase.text == "placement of m__prefill, context 0"
    assert next_phase(phase, "[info] Building HEF...") == Phase("building HEF")


def test_a_target_without_a_table_names_no_phase():
    assert phases.next_phase(None, None, "[info] Building HEF...") is None
    assert load_target(BUILTIN_TARGETS / "cpu-ort.toml").phases is None


@pytest.mark.parametrize(("watch", "key"), [
    ("[[watch.phases]]\npattern = 'Iteration #(?P<it>\\d+'\nphase = 'x'\n",
     "watch.phases[0].pattern"),
    ("[[watch.phases]]\npattern = 'a (?P<n>b)'\nphase = 'x'\ndetail = '{m}'\n",
     "watch.phases[0].detail"),
    ("[watch]\ngroup = '(unclosed'\n", "watch.group"),
    ("[watch]\ngroup = 'no_named_group'\n", "watch.group"),
])
def test_a_bad_table_is_a_one_line_error_naming_file_and_key(tmp_path, watch, key):
    good = (BUILTIN_TARGETS / "cpu-ort.toml").read_text()
    path = tmp_path / "npu.toml"
    path.write_text(good + "\n" + watch)
    with pytest.raises(SpecError) as err:
        load_target(path)
    assert err.value.key == key and "npu.toml" in str(err.value) and "\n" not in str(err.value)
