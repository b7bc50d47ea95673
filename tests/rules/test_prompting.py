"""Chat templates and BOS: what each kind of checkpoint gets sent (common.prompting and the
tokenizer attached to a HEF), with real tokenizers built offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rules"))

from common.hailo_tokenizer import prepare_tokenizer  # noqa: E402
from common.prompting import PromptError, adds_bos, encode_prompt, single_bos  # noqa: E402

WORDS = ["hello", "world", "system", "user", "assistant", "you", "are", "kind"]
# SmolLM2-Instruct's shape: its BOS is <|im_start|>, and the template writes it literally.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + ' ' + "
          "message['content'] + '<|im_end|>'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}")


def make_checkpoint(folder: Path, bos: str, template: str | None, post_bos: bool) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|im_end|>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": specials[1:]})
    folder.mkdir(parents=True)
    fast.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def load(folder: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def server_ids(prepared: Path, prompt: str) -> list[int]:
    """What the genai server would tokenize: the HEF's template, no post-processor."""
    tok = load(prepared)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    return tok(text, add_special_tokens=False).input_ids


def test_a_chat_model_keeps_its_template_and_sends_one_bos(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", "<|im_start|>", CHATML, post_bos=False)
    changes = prepare_tokenizer(ckpt, tmp_path / "hef-tokenizer", chat=True)
    assert changes["chat_template"] == CHATML  # as shipped: no {{ bos_token }} put in front
    start = load(ckpt).convert_tokens_to_ids("<|im_start|>")
    ids = server_ids(tmp_path / "hef-tokenizer", "hello world")
    assert ids[0] == start and ids[1] != start
    sent = encode_prompt(load(ckpt), "hello world", chat=True)
    assert sent.ids == ids  # the CPU verify sends what the device is sent
    assert sent.text == "<|im_start|>user hello world<|im_end|><|im_start|>assistant "
    assert sent.record()["sent"] == sent.text and sent.record()["prompt"] == "hello world"


def test_a_raw_text_model_sends_the_prompt_as_its_tokenizer_would(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", "<|im_start|>", CHATML, post_bos=False)
    prepare_tokenizer(ckpt, tmp_path / "hef-tokenizer", chat=False)
    tok = load(ckpt)
    assert not adds_bos(tok)
    plain = tok("hello world").input_ids
    assert server_ids(tmp_path / "hef-tokenizer", "hello world") == plain  # no BOS invented
    assert encode_prompt(tok, "hello world", chat=False).ids == plain


def test_plain_text_gets_bos_when_the_tokenizer_adds_it(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", "<s>", None, post_bos=True)
    prepare_tokenizer(ckpt, tmp_path / "hef-tokenizer", chat=False)
    tok = load(ckpt)
    assert adds_bos(tok)
    assert server_ids(tmp_path / "hef-tokenizer", "hello world") == tok("hello world").input_ids
    assert server_ids(tmp_path / "hef-tokenizer", "hello")[:2] == [tok.bos_token_id,
                                                                 tok.convert_tokens_to_ids("hello")]


def test_a_template_and_a_post_processor_that_both_add_bos_send_it_once(tmp_path: Path) -> None:
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ckpt = make_checkpoint(tmp_path / "ckpt", "<s>", template, post_bos=True)
    tok = load(ckpt)
    ids = encode_prompt(tok, "hello", chat=True).ids
    assert ids == [tok.bos_token_id, tok.convert_tokens_to_ids("hello")]


def test_chat_without_a_template_is_refused_in_one_line(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", "<s>", None, post_bos=True)
    with pytest.raises(PromptError, match="chat = true but its checkpoint ships no chat"):
        encode_prompt(load(ckpt), "hello", chat=True)
    with pytest.raises(ValueError, match="chat = true but its checkpoint ships no chat"):
        prepare_tokenizer(ckpt, tmp_path / "hef-tokenizer", chat=True)


def test_single_bos() -> None:
    assert single_bos([1, 1, 5], 1) == [1, 5]
    assert single_bos([1, 5, 1], 1) == [1, 5, 1]
    assert single_bos([1, 1], None) == [1, 1]
