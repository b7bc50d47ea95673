"""What a heartbeat says (hefbuild.execute.watch), fed plain numbers and a log file."""

from __future__ import annotations

from pathlib import Path

from hefbuild.declare.targets import BUILTIN_TARGETS, load_target
from hefbuild.execute import Watch
from hefbuild.execute.watch import OWN_PREFIX, StageWatch, message

# The phases of the DFC's log lines: hailo10h's declared table.
PHASES = load_target(BUILTIN_TARGETS / "hailo10h.toml").phases

MIB = 1 << 20
LAST = "Context:0/3 Iteration 4: Trying parallel mapping..."


def beat(elapsed: float, usual: float | None = None, builds: int = 0, silent: float = 12.0,
         phase: str | None = None, phase_s: float = 0.0) -> dict:
    b = {"elapsed_s": elapsed, "cpu_cores": 1.0, "rss_mb": 2048.0, "silent_s": silent,
         "last_line": LAST}
    if usual is not None:
        b.update(usual_s=usual, usual_builds=builds)
    if phase is not None:
        b.update(phase=phase, phase_s=phase_s)
    return b


def test_an_eta_of_hours():
    assert message(beat(4200, usual=12600, builds=2), 900, 1.0) == (
        "1 h 10 of about 3 h 30 (median of 2 earlier builds), 1.0 cores, 2048 MiB, "
        f"last output 12 s ago: {LAST}")


def test_an_eta_of_minutes_and_of_one_build():
    assert message(beat(240, usual=720, builds=3), 900, 1.0).startswith(
        "4 min of about 12 min (median of 3 earlier builds), 1.0 cores")
    assert message(beat(30, usual=95, builds=1), 900, 1.0).startswith(
        "30 s of about 95 s (1 earlier build), ")


def test_no_history_says_elapsed():
    assert message(beat(7500), 900, 1.0).startswith("2 h 05 elapsed, 1.0 cores, 2048 MiB")


def test_a_stage_far_past_its_usual_length_is_called_out():
    assert message(beat(26400, usual=12600, builds=2), 900, 1.0) == (
        "running 2.1× longer than usual (7 h 20 of about 3 h 30 (median of 2 earlier builds), "
        f"1.0 cores, 2048 MiB, last output 12 s ago): {LAST}")


def test_overdue_needs_both_the_ratio_and_minutes():
    assert "longer than usual" not in message(beat(30, usual=10, builds=2), 900, 1.0)
    assert "longer than usual" not in message(beat(3600 + 1700, usual=3600, builds=2), 900, 1)
    assert "1.6× longer" in message(beat(3600 + 2200, usual=3600, builds=2), 900, 1.0)


def test_the_phase_and_how_long_it_has_lasted():
    text = message(beat(4200, usual=12600, builds=2, phase="placement of model__prefill",
                        phase_s=42 * 60), 900, 1.0)
    assert text == ("1 h 10 of about 3 h 30 (median of 2 earlier builds), 1.0 cores, 2048 MiB, "
                    "last output 12 s ago; phase: placement of model__prefill (since 42 min): "
                    f"{LAST}")


def test_silence_past_the_usual_length_says_both():
    text = message(beat(26400, usual=12600, builds=2, silent=1200,
                        phase="placement of model__tbt", phase_s=3720), 900, 0.97)
    assert text == (
        "no output for 20 min, busy (1.0 cores since its last output), "
        "running 2.1× longer than usual "
        "(7 h 20 of about 3 h 30 (median of 2 earlier builds), 1.0 cores, 2048 MiB, last "
        f"output 20 min ago; phase: placement of model__tbt (since 1 h 02)): {LAST}")


# -- StageWatch: the window behind "busy" and "idle" -------------------------------------

def watch(tmp_path: Path, interval: float = 1.0, silence: float = 3.0, **kw) -> StageWatch:
    log = tmp_path / "log.txt"
    log.write_text("")
    return StageWatch(Watch(interval_s=interval, silence_s=silence, phases=PHASES, **kw), log,
                      started=0.0)


def run(w: StageWatch, until: float, cpu_rate, step: float = 0.1) -> list[dict]:
    """Samples every `step` s up to `until`; `cpu_rate(t)` is the CPU used per second."""
    beats, cpu, t = [], w.cpu_seconds, w._samples[-1][0] if w._samples else 0.0
    while t < until - 1e-9:
        t = round(t + step, 6)
        cpu += cpu_rate(t) * step
        b = w.sample(t, cpu, 100 * MIB)
        if b is not None:
            beats.append(b)
    return beats


def test_a_starved_busy_stage_is_not_idle(tmp_path: Path):
    # One core for 6 s, then descheduled for the 0.8 s before a beat (a loaded machine):
    # between two beats that looks idle, over the 5 s window it is busy.
    w = watch(tmp_path)
    run(w, 6.2, lambda t: 1.0)
    [b] = run(w, 7.0, lambda t: 0.0)
    assert b["message"].startswith("no output for 7 s, busy (")


def test_a_stage_that_gets_a_fifth_of_a_core_is_busy(tmp_path: Path):
    beats = run(watch(tmp_path), 8.0, lambda t: 0.2)
    assert "busy (0.2 cores since its last output)" in beats[-1]["message"]
    assert beats[-1]["cpu_cores"] == 0.2


def test_a_stage_quiet_for_the_whole_window_is_idle(tmp_path: Path):
    w = watch(tmp_path)
    run(w, 3.0, lambda t: 1.0)
    beats = run(w, 10.0, lambda t: 0.0)
    assert beats[-1]["message"].startswith("no output for 10 s, idle (10 s elapsed, 0.0 cores")


def test_idle_counts_only_the_time_since_the_last_output(tmp_path: Path):
    # Busy while printing, then silent and using nothing: idle, though the window still
    # holds the busy seconds before the last line.
    w = watch(tmp_path, interval=4.0, silence=3.0)
    run(w, 2.0, lambda t: 1.0)
    w.log_path.write_text("loading\n")
    beats = run(w, 8.0, lambda t: 0.0)
    assert "no output for 5 s, idle" in beats[-1]["message"], beats  # read at 2.1 s
    assert beats[-1]["message"].endswith(": loading")


def test_an_unreadable_sample_does_not_make_a_stage_idle(tmp_path: Path):
    w = watch(tmp_path)
    run(w, 3.9, lambda t: 1.0)
    assert w.sample(4.0, 0.0, 0) is not None  # the tree could not be read: 0 s of CPU
    b = w.sample(8.0, 7.9, 0)
    assert ", busy (" in b["message"] and b["cpu_cores"] > 0.9


# -- StageWatch: the log -------------------------------------------------------------------

def test_the_phase_comes_from_every_new_line_not_only_the_last(tmp_path: Path):
    w = watch(tmp_path, interval=10.0, silence=900.0, usual_s=300.0, usual_builds=2)
    run(w, 1.0, lambda t: 1.0)
    w.log_path.write_text("[INFO] Starting Hailo allocation and compilation flow\n"
                          "[INFO] Validating m__prefill_context_0 layer by layer\n"
                          "[info] conv65: Pass\n")
    run(w, 4.0, lambda t: 1.0)
    with open(w.log_path, "a") as log:
        log.write("Context:0/1 Iteration 4: Trying parallel mapping...\n")
    [b] = run(w, 10.0, lambda t: 1.0)
    assert b["phase"] == "placement of m__prefill, allocation (mapping), context 0/1, iteration 4"
    assert b["phase_s"] == 8.9  # since the placement began (read at 1.1 s), not the last step
    assert b["message"] == (
        "10 s of about 5 min (median of 2 earlier builds), 1.0 cores, 100 MiB, last output "
        "5 s ago; phase: placement of m__prefill, allocation (mapping), context 0/1, "
        "iteration 4 (since 8 s): Context:0/1 Iteration 4: Trying parallel mapping...")


def test_progress_bars_and_unfinished_lines(tmp_path: Path):
    w = watch(tmp_path, interval=1.0, silence=900.0)
    w.log_path.write_bytes(b"Calibration:  10%|#  | 3/32\rCalibration:  55%|#####  | 18/32")
    [b] = run(w, 1.0, lambda t: 1.0)
    assert b["phase"] == "statistics collection (calibration), 10%"  # the ended update
    assert b["last_line"] == "Calibration:  55%|#####  | 18/32"  # shown while unfinished
    with open(w.log_path, "ab") as log:
        log.write(b"\rCalibration: 100%|##########| 32/32\n")
    [b] = run(w, 2.0, lambda t: 1.0)
    assert b["phase"] == "statistics collection (calibration), 100%"


def test_our_own_heartbeat_lines_are_not_output(tmp_path: Path):
    w = watch(tmp_path, interval=1.0, silence=1.5)
    w.log_path.write_text("working\n")
    beats = run(w, 3.0, lambda t: 1.0)
    log = w.log_path.read_text()
    assert log.count(OWN_PREFIX) == 3 and log.startswith("working\n")
    assert beats[-1]["silent_s"] == 2.9 and beats[-1]["last_line"] == "working"
    assert beats[-1]["message"].startswith("no output for 2 s, busy (")
