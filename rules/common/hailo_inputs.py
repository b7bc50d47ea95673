"""Host-side inputs of the Hailo graph (numpy only: usable by the DFC stages without torch).

The exported graph (see `common.hailo_graph`) takes six inputs, batch 1, static length `seq`:

    inputs_embeds   [1, seq, hidden]              embedding rows of the token ids
    attention_mask  [1, 1, seq, n_heads*seq]      additive: 0 = attend, MASK_BLOCKED = blocked;
                                                  the [seq, seq] per-head mask tiled n_heads times
                                                  along the last axis (head h = columns h*seq..)
    cos_k, sin_k    [1, seq, head_dim*n_kv_heads] RoPE tables tiled once per key/value head
    cos_q, sin_q    [1, seq, head_dim*n_heads]    RoPE tables tiled once per query head

Padding convention (export gate, calibration): a prompt shorter than `seq` is LEFT-padded with
the pad id, so its last real token is always at position seq-1, the one position whose logits
the graph outputs. Pad keys are blocked for every query; a pad query attends to itself only (no
fully blocked row). Real tokens get RoPE positions 0..n-1 (pads get position 0), exactly what an
unpadded Hugging Face run sees. A prompt longer than `seq` is cut to its first `seq` tokens.
With a sliding window w (Mistral), query i also blocks keys j with i - j >= w, as transformers
does (`kv_idx > q_idx - sliding_window`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence

import numpy as np

INPUT_NAMES = ("inputs_embeds", "attention_mask", "cos_k", "sin_k", "cos_q", "sin_q")
MASK_BLOCKED = -1.0e4
# 1980-01-01: the earliest zip timestamp; fixed so .npz bytes do not depend on the clock.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def left_pad(ids: Sequence[int], seq: int, pad_id: int) -> tuple[np.ndarray, int]:
    """Cut to the first `seq` ids, left-pad to `seq`; return ([seq] int64, number of real ids)."""
    real = [int(i) for i in ids][:seq]
    if not real:
        raise ValueError("no tokens to pad")
    padded = np.full(seq, pad_id, dtype=np.int64)
    padded[seq - len(real) :] = real
    return padded, len(real)


def positions(n_real: int, seq: int) -> np.ndarray:
    """RoPE position of every slot: pads 0, real tokens 0..n_real-1 (left padding)."""
    pos = np.zeros(seq, dtype=np.int64)
    pos[seq - n_real :] = np.arange(n_real, dtype=np.int64)
    return pos


def head_mask(n_real: int, seq: int, sliding_window: int | None = None) -> np.ndarray:
    """[seq, seq] additive mask of one head (rows = queries, columns = keys)."""
    q = np.arange(seq)[:, None]
    k = np.arange(seq)[None, :]
    first_real = seq - n_real
    allowed = (k <= q) & (k >= first_real)
    if sliding_window is not None:
        allowed &= k > q - int(sliding_window)
    allowed |= (q == k) & (q < first_real)  # a pad query sees itself: no fully blocked row
    return np.where(allowed, 0.0, MASK_BLOCKED).astype(np.float32)


def attention_mask(
    n_real: int, seq: int, n_heads: int, sliding_window: int | None = None
) -> np.ndarray:
    """[1, 1, seq, n_heads*seq]: the per-head mask tiled along the last axis."""
    return np.tile(head_mask(n_real, seq, sliding_window), (1, n_heads))[None, None]


def rope_tables(
    pos: np.ndarray, head_dim: int, rope_theta: float, n_heads: int
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [1, seq, head_dim*n_heads] for the default RoPE (rotate-half layout).

    Computed in float32 the way transformers does (inv_freq, then position * inv_freq).
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(rope_theta) ** exponent)).astype(np.float32)
    freqs = pos.astype(np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos = np.tile(np.cos(emb).astype(np.float32), (1, n_heads))[None]
    sin = np.tile(np.sin(emb).astype(np.float32), (1, n_heads))[None]
    return cos, sin


def graph_inputs(
    padded_ids: np.ndarray,
    n_real: int,
    embedding_table: np.ndarray,
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    rope_theta: float,
    sliding_window: int | None = None,
) -> dict[str, np.ndarray]:
    """The six graph inputs for one left-padded prompt, float32, in INPUT_NAMES order."""
    seq = int(padded_ids.shape[0])
    pos = positions(n_real, seq)
    cos_k, sin_k = rope_tables(pos, head_dim, rope_theta, n_kv_heads)
    cos_q, sin_q = rope_tables(pos, head_dim, rope_theta, n_heads)
    return {
        "inputs_embeds": embedding_table[padded_ids][None].astype(np.float32),
        "attention_mask": attention_mask(n_real, seq, n_heads, sliding_window),
        "cos_k": cos_k,
        "sin_k": sin_k,
        "cos_q": cos_q,
        "sin_q": sin_q,
    }


class _ByteCount:
    """A write-only sink that only counts: the size of what np.save writes, before writing it."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)


def save_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Like np.savez (np.load reads it), but byte-identical run to run: members in sorted order,
    uncompressed, with a fixed timestamp (np.savez stamps the current time). Each array is
    written into the archive in numpy's 16 MiB chunks (the embedding table is as big as a
    projection): its size is counted by a first pass, as the member header written first
    needs it."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            array = np.asarray(arrays[name])
            count = _ByteCount()
            np.lib.format.write_array(count, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.file_size = count.size
            with zf.open(info, "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
