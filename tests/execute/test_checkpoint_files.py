"""Which files of a snapshot a lock keeps: what loading, tokenizing and templating read."""

from __future__ import annotations

import pytest

from hefbuild.execute.hub import checkpoint_files

TOKENIZER = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "tokenizer.model", "merges.txt", "vocab.txt", "vocab.json", "added_tokens.json"]


def test_a_typical_repository_keeps_model_tokenizer_and_template():
    kept = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "model.safetensors.index.json",
            "chat_template.jinja", "chat_template.json", *TOKENIZER,
            "tokenizer/tokenizer.json", "tokenizer/extra.tiktoken"]
    dropped = ["README.md", ".gitattributes", "LICENSE", "LICENSE.txt", "USE_POLICY.md",
               "requirements.txt", "figures/benchmark.png", "logo.jpg", "onnx/model.onnx",
               "onnx/model_quantized.onnx", "onnx/config.json", "model.onnx", "model.onnx_data",
               "openvino/openvino_model.xml", "original/consolidated.00.pth",
               "original/params.json", "original/tokenizer.model",
               "pytorch_model.bin", "pytorch_model-00001-of-00002.bin",
               "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
               "model-q4.gguf", "training_args.bin", "optimizer.pt", "trainer_state.json",
               "modeling_custom.py", "configuration_custom.py", ".cache/huggingface/x.json",
               "consolidated.safetensors", "coreml/model.mlpackage/Manifest.json"]
    assert checkpoint_files(kept + dropped) == sorted(kept)


def test_pytorch_weights_only_without_safetensors():
    names = ["config.json", "pytorch_model-00001-of-00002.bin",
             "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json",
             "training_args.bin", "tf_model.h5", "flax_model.msgpack", "tokenizer.json"]
    assert checkpoint_files(names) == [
        "config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json", "tokenizer.json"]


@pytest.mark.parametrize("weights", [["tf_model.h5"], ["flax_model.msgpack"],
                                     ["model-q8_0.gguf"]])
def test_other_frameworks_weights_only_when_nothing_else(weights):
    assert checkpoint_files(["config.json", "README.md", *weights]) == ["config.json", *weights]


def test_mistral_consolidated_is_kept_when_it_is_the_only_safetensors():
    assert checkpoint_files(["params.json", "consolidated.safetensors"]) == [
        "consolidated.safetensors", "params.json"]


def test_sub_folders_keep_their_relative_path_and_windows_separators_become_slashes():
    assert checkpoint_files(["sub\\config.json", "a/b/model.safetensors", "a/b/notes.md"]) == [
        "a/b/model.safetensors", "sub/config.json"]


def test_nothing_for_a_folder_without_checkpoint_files():
    assert checkpoint_files(["README.md", ".gitattributes", "image.png"]) == []
