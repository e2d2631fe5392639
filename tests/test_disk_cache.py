"""The disk tier on its own: entries written by the writer thread and read back bit for bit; corrupt, truncated,
foreign-namespace, other-version and stray files are never served and are removed; a write that died leaves nothing
behind; the size bound holds under churn (least recently used first); a full disk or an IO error is counted and
logged while the cache keeps working."""

import errno
import os
import struct

import pytest
import torch

from engine.cache import disk as disk_cache
from engine.cache.disk import HEADER, DiskCache, namespace
from tests.test_host_cache import pools

NS = namespace({"model": "tiny", "kv": "bf16"})


def views(nbytes: int, parts: int = 2) -> list[torch.Tensor]:
    """An entry's bytes as `parts` buffers (a host tier entry spanning blocks)."""
    cut = nbytes // parts
    return [torch.zeros(cut, dtype=torch.uint8), torch.zeros(nbytes - cut, dtype=torch.uint8)]


def written(tmp_path, **kw):
    """A disk tier holding pages 0..2 (keys p0..p2) and the state of slot 1 (key s1)."""
    p = pools()
    disk = DiskCache(tmp_path, NS, budget_bytes=kw.pop("budget", 1 << 20), **kw)
    disk.write_pages(p, [b"p0" * 8, b"p1" * 8, b"p2" * 8], [0, 1, 2])
    disk.write_state(p, b"s1" * 8, 1)
    disk.flush()
    return p, disk


def test_entries_come_back_bit_for_bit_and_survive_a_restart(tmp_path):
    p, disk = written(tmp_path)
    disk.close()
    again = DiskCache(tmp_path, NS, budget_bytes=1 << 20)
    assert again.has("page", b"p1" * 8) and again.has("state", b"s1" * 8)
    got = views(p.page_nbytes)
    assert again.read_into("page", b"p1" * 8, got)
    assert torch.equal(torch.cat(got), p.read_pages([1])[0])
    state = views(p.state_nbytes)
    assert again.read_into("state", b"s1" * 8, state)
    assert torch.equal(torch.cat(state), p.read_state(1))
    s = again.stats()
    assert (s["disk_pages"], s["disk_snapshots"], s["disk_hit_pages"], s["disk_hit_snapshots"]) == (3, 1, 1, 1)
    again.close()


def entry(disk, kind, key):
    return disk.dir / kind / f"{key.hex()}.kv"


def flip_payload_byte(path):
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[:-3])


def other_version(path):
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, disk_cache.FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))


def foreign(path):
    """Another model's entry under this name (same key, another namespace in its header)."""
    data = bytearray(path.read_bytes())
    at = struct.calcsize("<4sIB3x16s")                  # the namespace's place in HEADER
    data[at:at + 16] = namespace({"model": "other"})
    path.write_bytes(bytes(data))


def trailing(path):
    path.write_bytes(path.read_bytes() + b"x")


@pytest.mark.parametrize("damage", [flip_payload_byte, truncate, other_version, foreign, trailing,
                                    lambda path: path.write_bytes(b"")])
def test_a_damaged_or_foreign_entry_is_rejected_and_removed(tmp_path, damage):
    p, disk = written(tmp_path)
    path = entry(disk, "page", b"p0" * 8)
    damage(path)
    got = views(p.page_nbytes)
    assert not disk.read_into("page", b"p0" * 8, got)
    assert not path.exists() and not disk.has("page", b"p0" * 8)
    assert disk.stats()["disk_rejected"] == 1
    assert disk.read_into("page", b"p1" * 8, views(p.page_nbytes))    # the others still serve
    disk.close()


def test_many_entries_read_at_once_each_checked_on_its_own(tmp_path):
    """read_many (the reader threads): the good entries come back bit for bit beside a damaged and a missing one,
    which are removed and reported False in their places."""
    p, disk = written(tmp_path)
    flip_payload_byte(entry(disk, "page", b"p1" * 8))
    keys = [b"p0" * 8, b"p1" * 8, b"p2" * 8, b"gone" * 4]
    got = [views(p.page_nbytes) for _ in keys]
    assert disk.read_many([("page", k, v) for k, v in zip(keys, got)]) == [True, False, True, False]
    assert torch.equal(torch.cat(got[0]), p.read_pages([0])[0]) and torch.equal(torch.cat(got[2]), p.read_pages([2])[0])
    assert not entry(disk, "page", b"p1" * 8).exists() and not disk.has("page", b"p1" * 8)
    s = disk.stats()
    assert (s["disk_pages"], s["disk_hit_pages"], s["disk_rejected"]) == (2, 2, 1)
    disk.close()


def test_a_file_that_vanished_is_a_plain_miss(tmp_path):
    p, disk = written(tmp_path)
    entry(disk, "page", b"p0" * 8).unlink()
    assert not disk.read_into("page", b"p0" * 8, views(p.page_nbytes)) and not disk.has("page", b"p0" * 8)
    assert disk.stats()["disk_rejected"] == 0
    disk.close()


def test_another_namespace_is_never_looked_at_and_a_dead_writes_temporary_file_is_removed(tmp_path):
    p, disk = written(tmp_path)
    disk.close()
    stale = entry(disk, "page", b"p0" * 8).with_name(".tmp-abc-123")
    stale.write_bytes(b"half a page")                   # kill -9 during a write
    other = DiskCache(tmp_path, namespace({"model": "other"}), budget_bytes=1 << 20)
    assert not other.has("page", b"p0" * 8) and not stale.exists()
    assert other.size_bytes() == disk.size_bytes() > 0  # but its files count toward the bound
    other.close()


def test_the_size_bound_holds_under_churn_least_recently_used_first(tmp_path):
    p = pools(num_pages=6)
    entry_bytes = HEADER.size + p.page_nbytes
    disk = DiskCache(tmp_path, NS, budget_bytes=4 * entry_bytes)
    keys = [bytes([i]) * 16 for i in range(30)]
    for i, key in enumerate(keys[:4]):
        disk.write_pages(p, [key], [i % 6])
        disk.flush()
    os.utime(entry(disk, "page", keys[0]), (1, 1))     # make the order unambiguous on coarse clocks
    for i, key in enumerate(keys[1:4]):
        os.utime(entry(disk, "page", key), (2 + i, 2 + i))
    disk._scan()
    assert disk.read_into("page", keys[0], views(p.page_nbytes))   # read: now the most recently used
    disk.write_pages(p, [keys[4]], [4])
    disk.flush()
    assert disk.has("page", keys[0]) and not disk.has("page", keys[1])
    for i, key in enumerate(keys[5:]):
        disk.write_pages(p, [key], [i % 6])
        disk.flush()
        assert disk.size_bytes() <= 4 * entry_bytes
    files = list((disk.dir / "page").iterdir())
    assert len(files) == 4 and disk.stats()["disk_pages"] == 4
    disk.close()


def test_a_full_disk_is_logged_and_the_cache_carries_on(tmp_path, monkeypatch, caplog):
    p = pools()
    disk = DiskCache(tmp_path, NS, budget_bytes=1 << 20)
    real_open = open

    def full(path, mode="r", *a, **kw):
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", full)
    disk.write_pages(p, [b"p0" * 8], [0])
    disk.flush()
    assert disk.stats()["disk_write_errors"] == 1 and not disk.has("page", b"p0" * 8)
    assert "No space left" in caplog.text
    assert not [f for f in tmp_path.rglob("*") if f.is_file()]     # no temporary file left behind
    monkeypatch.undo()
    disk.write_pages(p, [b"p0" * 8], [0])               # space again: written
    disk.flush()
    assert disk.has("page", b"p0" * 8) and disk._thread.is_alive()
    disk.close()


def test_a_job_that_fails_gives_back_its_keys_and_bytes(tmp_path, monkeypatch, caplog):
    """A failure outside the file write (on the GPU: the copy's event) must not leave the keys queued forever
    (never written again) nor their bytes counted against the pending bound."""
    p = pools()
    disk = DiskCache(tmp_path, NS, budget_bytes=1 << 20, max_pending_bytes=p.page_nbytes)
    real = disk._write_file

    def broken(*_):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(disk, "_write_file", broken)
    disk.write_pages(p, [b"p0" * 8], [0])
    disk.flush()
    assert "writer failed" in caplog.text and disk.stats()["disk_write_errors"] == 1
    assert not disk.has("page", b"p0" * 8) and disk._staging.used == 0
    monkeypatch.setattr(disk, "_write_file", real)
    disk.write_pages(p, [b"p0" * 8], [0])               # within the bound again, and written
    disk.flush()
    assert disk.has("page", b"p0" * 8) and disk.stats()["disk_write_skipped"] == 0
    disk.close()


def test_writes_beyond_the_pending_bound_are_skipped_not_waited_for(tmp_path):
    p = pools()
    disk = DiskCache(tmp_path, NS, budget_bytes=1 << 20, max_pending_bytes=p.page_nbytes)
    disk._queue.put(None)                               # the writer stops: nothing drains
    disk._thread.join()
    disk.write_pages(p, [b"p0" * 8], [0])
    disk.write_pages(p, [b"p1" * 8], [1])               # over the bound: skipped at once
    assert disk.stats()["disk_write_skipped"] == 1


CHILD = """
import sys, torch
from engine.cache.disk import DiskCache
from tests.test_disk_cache import NS
from tests.test_host_cache import pools
p = pools(num_pages=64, page_size=256)
disk = DiskCache(sys.argv[1], NS, budget_bytes=1 << 30)
for i in range(100000):
    disk.write_pages(p, [i.to_bytes(16, "little")], [i % 64])
    if i == 20:
        print("writing", flush=True)
"""


def test_killed_mid_write_the_next_start_serves_only_whole_entries(tmp_path):
    """kill -9 while the writer thread writes: no temporary file survives the next start, and every entry it
    indexes reads back whole."""
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert child.stdout.readline().strip() == b"writing"
    time.sleep(0.3)
    child.kill()
    child.wait()
    p = pools(num_pages=64, page_size=256)
    disk = DiskCache(tmp_path, NS, budget_bytes=1 << 30)
    keys = [bytes.fromhex(f.stem) for f in (disk.dir / "page").glob("*.kv")]
    assert keys and not list(tmp_path.rglob(".tmp-*"))
    for key in keys:
        assert disk.read_into("page", key, views(p.page_nbytes)), key
    disk.close()
