"""The transfer benchmark takes a round's files out of the way without deleting them (an
ext4 without a journal makes every create scan past inodes freed in the last minutes), and
must never empty a seeded blob, which shares its inode with the benchmark's own copy."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _transfers():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("bench_transfers",
                                                      BENCHMARKS / "transfers.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_retired_file_is_emptied_and_its_inode_kept(tmp_path):
    bench = _transfers().Bench(tmp_path, nginx=None, blobs={})
    out = tmp_path / "out"
    out.write_bytes(b"x" * 4096)
    out.chmod(0o444)  # as a store object is
    ino = out.stat().st_ino
    bench.retire(out)
    assert not out.exists()
    [kept] = bench.retired.iterdir()
    assert (kept.stat().st_ino, kept.stat().st_size) == (ino, 0)


def test_a_seeded_link_is_moved_and_its_pool_copy_left_whole(tmp_path):
    bench = _transfers().Bench(tmp_path, nginx=None, blobs={})
    pool, seeded = tmp_path / "pool-blob", tmp_path / "seeded"
    pool.write_bytes(b"y" * 4096)
    os.link(pool, seeded)
    bench.retire(seeded)
    bench.retire(tmp_path / "never-there")  # a round that had nothing to take away
    assert not seeded.exists()
    assert pool.read_bytes() == b"y" * 4096
    assert len(list(bench.retired.iterdir())) == 1
