"""The tokenizer attached to a HEF, prepared for the Hailo genai server.

The server ignores the tokenizer's post-processor (so it never adds BOS itself), always renders
the HEF's chat template around the messages it is given, and detokenizes one token at a time
(so a `Strip` decoder step eats the leading space of every token). Hence:
- `tokenizer_config.json` gets the template the server must render (`common.prompting`):
  for a chat model (`chat = true`) the template the checkpoint ships, as shipped (a template
  that wants BOS writes it; prepending one would double SmolLM2's `<|im_start|>`); for a
  raw-text model, the messages' contents concatenated, after `{{ bos_token }}` only when the
  tokenizer's post-processor puts BOS before plain text;
- every `Strip` step is removed from the `tokenizer.json` decoder.
The post-processor itself is kept: Hugging Face clients tokenize the rendered template with
add_special_tokens=False. Files are written deterministically (sorted keys for the config,
original key order for tokenizer.json, fixed indent).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
BOS_PREFIX = "{{ bos_token }}"
COPIED = (
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def server_template(existing: str | None, chat: bool, plain_bos: bool) -> str:
    """The template the server renders: the shipped one for a chat model, else plain text
    (BOS first when the tokenizer would add it to plain text)."""
    if chat:
        if not existing:
            raise ValueError("the model declares chat = true but its checkpoint ships no chat "
                             "template (chat_template.jinja or tokenizer_config.json)")
        return existing
    return BOS_PREFIX + PLAIN_TEMPLATE if plain_bos else PLAIN_TEMPLATE


def strip_free_decoder(decoder: dict[str, Any] | None) -> dict[str, Any] | None:
    """The decoder without `Strip` steps (a lone Strip decoder becomes none)."""
    if decoder is None or decoder.get("type") == "Strip":
        return None
    if decoder.get("type") == "Sequence":
        steps = [d for d in decoder.get("decoders", []) if d.get("type") != "Strip"]
        return {**decoder, "decoders": steps}
    return decoder


def _dump(data: Any, path: Path, sort_keys: bool) -> None:
    text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=sort_keys)
    path.write_text(text + "\n", encoding="utf-8")


def _existing_template(ckpt: Path, config: dict[str, Any]) -> str | None:
    jinja = ckpt / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    return template if isinstance(template, str) else None


def plain_text_gets_bos(ckpt: Path) -> bool:
    from transformers import AutoTokenizer

    from .prompting import adds_bos

    return adds_bos(AutoTokenizer.from_pretrained(ckpt, local_files_only=True))


def prepare_tokenizer(ckpt: Path, dest: Path, chat: bool = False) -> dict[str, Any]:
    """Write the server-ready tokenizer into `dest`; return what changed (for the report)."""
    tok_json = ckpt / "tokenizer.json"
    if not tok_json.is_file():
        raise FileNotFoundError("checkpoint has no tokenizer.json (a fast tokenizer is required)")
    config_path = ckpt / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    tokenizer = json.loads(tok_json.read_text(encoding="utf-8"))

    dest.mkdir(parents=True, exist_ok=True)
    before = tokenizer.get("decoder")
    tokenizer["decoder"] = strip_free_decoder(before)
    _dump(tokenizer, dest / "tokenizer.json", sort_keys=False)

    existing = _existing_template(ckpt, config)
    plain_bos = not chat and plain_text_gets_bos(ckpt)
    config["chat_template"] = server_template(existing, chat, plain_bos)
    _dump(config, dest / "tokenizer_config.json", sort_keys=True)
    for name in COPIED:
        if (ckpt / name).is_file():
            shutil.copyfile(ckpt / name, dest / name)
    return {
        "chat": chat,
        "chat_template": config["chat_template"],
        "chat_template_was_present": existing is not None,
        "decoder_strip_removed": before != tokenizer["decoder"],
    }
