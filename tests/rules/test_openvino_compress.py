"""compress (openvino): NNCF's failure on a group size that does not divide a layer's input
channels names every layer; the failure line keeps a count, the first and the sizes that fit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "rules"
sys.path.insert(0, str(RULES))  # the rule's `common` package
# By file, under a name of its own: a plain `compress` on sys.path would shadow others'.
_spec = importlib.util.spec_from_file_location("openvino_compress_rule",
                                               RULES / "openvino" / "compress.py")
_rule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rule)
reason = _rule.reason

HEAD = ("Failed to apply group-wise quantization with group size value 128. Ensure that the "
        "group size is divisible by the channel size, or consider setting "
        "`group_size_fallback_mode` to IGNORE or ADJUST.")


def nncf_error(layers: list[tuple[str, int]]) -> ValueError:
    nodes = " ".join(f'"{name}/aten::linear/MatMul" (channel size: {size})'
                     for name, size in layers)
    return ValueError(f"{HEAD} Failed nodes: {nodes}")


def test_a_list_of_failed_nodes_becomes_a_count_and_the_sizes_that_divide():
    layers = [(f"__module.model.layers.{i}.self_attn.q_proj", 576) for i in range(180)]
    text = reason(nncf_error(layers))
    assert text.startswith(HEAD)
    assert "180 failed nodes (channel sizes 576)" in text
    assert "the first __module.model.layers.0.self_attn.q_proj/aten::linear/MatMul" in text
    assert text.endswith("group_size values that divide them: 16, 32, 64, or -1 (channel-wise)")
    assert len(text) < 600


def test_sizes_with_no_common_group_size_leave_channel_wise():
    text = reason(nncf_error([("a", 576), ("b", 200)]))
    assert "2 failed nodes (channel sizes 200, 576)" in text
    assert text.endswith("no declared group_size divides them: -1 (channel-wise)")


def test_another_error_is_kept_as_it_is():
    assert reason(RuntimeError("out of memory")) == "out of memory"
