"""The tokenizer attached to a HEF, prepared for the Hailo genai server.

The server ignores the tokenizer's post-processor (so it never adds BOS) and detokenizes one
token at a time (so a `Strip` decoder step eats the leading space of every token). Hence:
- `tokenizer_config.json` gets a `chat_template` that emits `bos_token` before the messages
  (an existing template is kept, with `{{ bos_token }}` prepended unless it already uses it;
  without one, the messages' contents are concatenated; without a BOS token nothing is added);
- every `Strip` step is removed from the `tokenizer.json` decoder.
The post-processor itself is kept: Hugging Face clients tokenize the chat template with
add_special_tokens=False, so BOS is still added once. Files are written deterministically
(sorted keys for the config, original key order for tokenizer.json, fixed indent).
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


def chat_template(existing: str | None, has_bos: bool) -> str:
    template = existing or PLAIN_TEMPLATE
    if has_bos and "bos_token" not in template:
        template = BOS_PREFIX + template
    return template


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


def prepare_tokenizer(ckpt: Path, dest: Path) -> dict[str, Any]:
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

    bos = config.get("bos_token")
    existing = _existing_template(ckpt, config)
    config["chat_template"] = chat_template(existing, has_bos=bool(bos))
    _dump(config, dest / "tokenizer_config.json", sort_keys=True)
    for name in COPIED:
        if (ckpt / name).is_file():
            shutil.copyfile(ckpt / name, dest / name)
    return {
        "chat_template": config["chat_template"],
        "chat_template_was_present": existing is not None,
        "decoder_strip_removed": before != tokenizer["decoder"],
    }
