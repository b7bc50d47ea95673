"""fetch: produce `checkpoint/`, a Hugging Face folder (model + tokenizer), for every target.

Three sources:
- synthetic: train a byte-level BPE tokenizer on a corpus, build a small randomly initialised
  model of the requested architecture, optionally train it briefly so greedy output is
  not degenerate, and save everything deterministically.
- hub: download pinned files at a commit and check each SHA-256.
- local: copy the listed files of a checkpoint folder (the engine passes it, read-only, as
  the file `source_dir`; it is in no key) and check each SHA-256.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.action import Action, check_outputs, fail, load_action
from common.digest import sha256_file

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ARCHITECTURES = ("llama", "qwen2", "mistral", "qwen3")
# ids 0/1/2 are what Llama-style configs expect for pad/bos/eos, so keep that order.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
)
OPTIONAL_CONFIG_KEYS = ("head_dim", "rope_theta", "tie_word_embeddings", "sliding_window")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

# Brief training recipe, tuned on the tiny models: ~11 ms/step on one CPU thread, and by
# ~800 steps greedy continuations of corpus openings have margins that survive int8 QDQ.
# Blocks of 32 tokens cover a short prompt plus 16 generated tokens.
TRAIN_BLOCK = 32
TRAIN_BATCH = 16
TRAIN_LR = 6e-3
TRAIN_WARMUP = 20
TRAIN_MIN_LR_RATIO = 0.1
COMMIT_RE = re.compile(r"[0-9a-fA-F]{40}")


# ---------------------------------------------------------------- synthetic


def read_corpus(path: Path) -> list[str]:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        fail(f"fetch: cannot read corpus {path.name}: {exc}")
    lines = [ln for ln in lines if ln]
    if not lines:
        fail(f"fetch: corpus {path.name} has no non-empty lines")
    return lines


def train_tokenizer(lines: list[str], vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    # Prompts get <s> in front, matching how every training line starts.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != token_id:
            fail(f"fetch: tokenizer placed special token {token} at an unexpected id")
    return tok


def save_tokenizer(tok: Any, ckpt: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(ckpt)
    return fast


def build_config(spec: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    missing = [k for k in CONFIG_KEYS if k not in spec]
    if missing:
        fail(f"fetch: source.synthetic lacks {', '.join(missing)}")
    kwargs = {k: spec[k] for k in CONFIG_KEYS}
    kwargs.update({k: spec[k] for k in OPTIONAL_CONFIG_KEYS if spec.get(k) is not None})
    # Embedding / lm_head rows beyond the tokenizer: a large model vocabulary without a large
    # tokenizer (the extra rows are never produced by the tokenizer, only by the model).
    if spec.get("model_vocab_size") is not None:
        if int(spec["model_vocab_size"]) < int(spec["vocab_size"]):
            fail(
                f"fetch: source.synthetic.model_vocab_size {spec['model_vocab_size']} < "
                f"vocab_size {spec['vocab_size']} (the model must cover the tokenizer)"
            )
        kwargs["vocab_size"] = int(spec["model_vocab_size"])
    kwargs.update(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    return AutoConfig.for_model(spec["architecture"], **kwargs)


def token_stream(tok: Any, lines: list[str]) -> list[int]:
    ids: list[int] = []
    for line in lines:
        ids.append(BOS_ID)
        ids.extend(tok.encode(line, add_special_tokens=False).ids)
        ids.append(EOS_ID)
    return ids


def lr_factor(step: int, total: int) -> float:
    """Linear warm-up, then cosine decay to a floor; keeps the short run stable."""
    if step < TRAIN_WARMUP:
        return (step + 1) / TRAIN_WARMUP
    progress = (step - TRAIN_WARMUP) / max(1, total - TRAIN_WARMUP)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return TRAIN_MIN_LR_RATIO + (1.0 - TRAIN_MIN_LR_RATIO) * cosine


def train(model: Any, stream: list[int], steps: int, seed: int, block: int) -> float:
    import torch

    data = torch.tensor(stream, dtype=torch.long)
    if data.numel() <= block + 1:
        fail(f"fetch: corpus is too short ({data.numel()} tokens) for training blocks of {block}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.01, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps))
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        starts = torch.randint(0, data.numel() - block, (TRAIN_BATCH,), generator=gen)
        batch = torch.stack([data[s : s + block] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        if step % 50 == 0 or step == steps - 1:
            print(f"train step {step:4d}/{steps} loss {loss_value:.4f}", flush=True)
    model.eval()
    return loss_value


def build_synthetic(action: Action, ckpt: Path) -> None:
    spec = action.source["synthetic"]
    arch = spec.get("architecture")
    if arch not in ARCHITECTURES:
        fail(f"fetch: source.synthetic.architecture {arch!r} is not one of {list(ARCHITECTURES)}")
    vocab_size = int(spec.get("vocab_size", 0))
    if vocab_size < MIN_VOCAB:
        fail(
            f"fetch: source.synthetic.vocab_size {vocab_size} < {MIN_VOCAB} (256 bytes + specials)"
        )
    seed = int(spec.get("seed", 0))
    steps = int(spec.get("train_steps", 0) or 0)

    from common.determinism import pin_torch

    pin_torch(seed)
    import torch
    from transformers import AutoModelForCausalLM

    lines = read_corpus(action.file("corpus"))
    tok = train_tokenizer(lines, vocab_size)
    print(f"tokenizer: {tok.get_vocab_size()} tokens from {len(lines)} corpus lines", flush=True)

    cfg = build_config(spec)
    torch.manual_seed(seed)
    # Eager attention: the reference implementation, and what export traces later.
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {arch}, {n_params} parameters, seed {seed}", flush=True)

    if steps > 0:
        block = min(TRAIN_BLOCK, int(spec["max_position_embeddings"]))
        final = train(model, token_stream(tok, lines), steps, seed, block)
        print(f"trained {steps} steps, final loss {final:.4f}", flush=True)

    ckpt.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(ckpt, safe_serialization=True)
    save_tokenizer(tok, ckpt)


# ---------------------------------------------------------------- hub


def scrub(text: str) -> str:
    """First line of an error, with any token value masked: errors must never leak it."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else "unknown error"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        secret = os.environ.get(var)
        if secret:
            line = line.replace(secret, "***")
    return line


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")


def download(repo: str, revision: str, filename: str) -> Path:
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import hf_hub_download

    where = f"{repo}@{revision}"
    try:
        return Path(hf_hub_download(repo, filename, revision=revision))
    except hf_errors.GatedRepoError:
        fail(f"fetch: {repo} is gated; accept its licence on the hub and provide HF_TOKEN")
    except hf_errors.RevisionNotFoundError:
        fail(f"fetch: revision {revision} not found in {repo}")
    except hf_errors.RepositoryNotFoundError:
        fail(f"fetch: hub repository {repo} not found (or private and HF_TOKEN is missing)")
    except hf_errors.LocalEntryNotFoundError as exc:
        offline = " (HF_HUB_OFFLINE is set)" if hub_offline() else ""
        reason = f"{scrub(exc)}{offline}"
        fail(f"cannot reach the hub to download {where}: {reason}; fetch needs network access")
    except hf_errors.EntryNotFoundError:
        fail(f"fetch: file {filename} does not exist in {where}")
    except Exception as exc:  # noqa: BLE001 - any transport failure must end in one clear line
        reason = f"{type(exc).__name__}: {scrub(exc)}"
        fail(f"cannot reach the hub to download {where}: {reason}; fetch needs network access")


def safe_relative(filename: str) -> Path:
    rel = Path(filename)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        fail(f"fetch: source.files entry {filename!r} is not a plain relative path")
    return rel


def fetch_hub(action: Action, ckpt: Path) -> None:
    repo = str(action.source["hub"])
    revision = str(action.source.get("revision", ""))
    if not COMMIT_RE.fullmatch(revision):
        fail(
            f"fetch: source.revision {revision!r} for {repo} is not a commit hash; "
            "a 40-hex-character commit hash is expected (branches and tags can move)"
        )
    files = dict(action.source.get("files") or {})
    if not files:
        fail(f"fetch: source.files is empty for {repo}; declare each file with its sha256")
    ckpt.mkdir(parents=True, exist_ok=True)
    for filename in sorted(files):
        rel = safe_relative(filename)
        cached = download(repo, revision, filename)
        actual = sha256_file(cached)
        expected = str(files[filename]).lower()
        if actual != expected:
            fail(
                f"fetch: sha256 mismatch for {filename} in {repo}@{revision}: "
                f"got {actual}, declared {expected}"
            )
        dest = ckpt / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, dest)
        print(f"fetched {filename} ({dest.stat().st_size} bytes, sha256 ok)", flush=True)


# ---------------------------------------------------------------- local folder


def fetch_local(action: Action, ckpt: Path) -> None:
    files = dict(action.source.get("files") or {})
    if not files:
        fail("fetch: source.files is empty for the local folder; run `doit lock:"
             f"{action.model}` or declare each file with its sha256")
    if "source_dir" not in action.files:
        fail("fetch: the engine passed no source_dir for this local source (it needs the "
             "local-source engine change)")
    folder = action.files["source_dir"]
    if not folder.is_dir():
        fail(f"fetch: source folder {folder} does not exist (or is not readable here)")
    ckpt.mkdir(parents=True, exist_ok=True)
    for filename in sorted(files):
        rel = safe_relative(filename)
        src, dest = folder / rel, ckpt / rel
        if not src.is_file():
            fail(f"fetch: {filename} is missing from the source folder {folder}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)  # then hash the copy: what is checked is what is kept
        actual = sha256_file(dest)
        expected = str(files[filename]).lower()
        if actual != expected:
            fail(f"fetch: sha256 mismatch for {filename} in the source folder {folder}: "
                 f"got {actual}, declared {expected} (run `doit lock:{action.model}` if "
                 f"the change is intended)")
        print(f"copied {filename} ({dest.stat().st_size} bytes, sha256 ok)", flush=True)


def main() -> None:
    action = load_action(sys.argv)
    ckpt = action.out / "checkpoint"
    if "synthetic" in action.source:
        build_synthetic(action, ckpt)
    elif "hub" in action.source:
        fetch_hub(action, ckpt)
    elif action.source.get("local"):
        fetch_local(action, ckpt)
    else:
        fail(f"fetch: source must have 'synthetic', 'hub' or 'local', got "
             f"{sorted(action.source)}")
    check_outputs(action)


if __name__ == "__main__":
    main()
