"""The build cache's size limit: least recently used entries go first, what the current build used never does."""

from __future__ import annotations

import os
import time

import pytest

from edgekit.cache import STALE_TEMP_S, BuildCache, cache_limit_bytes
from edgekit.errors import ConfigError


def _fill(root, names_sizes: dict[str, int]) -> None:
    """Entries written by an earlier process (this test's BuildCache instances do not count them as used)."""
    writer = BuildCache(root)
    for i, (name, size) in enumerate(names_sizes.items()):
        writer.put("stage", name * 8, {"blob": b"x" * size})
        stamp = time.time() - 1000 + i  # written in this order, one second apart
        os.utime(writer._entry("stage", name * 8) / ".complete", (stamp, stamp))


def _keys(root) -> set[str]:
    return {d.name[:1] for d in (root / "v1" / "stage").glob("*/*") if (d / ".complete").exists()}


def test_prune_removes_the_least_recently_used_entries_until_the_cache_fits(tmp_path):
    _fill(tmp_path, {"a": 1000, "b": 1000, "c": 1000, "d": 1000})
    reader = BuildCache(tmp_path)
    assert reader.get("stage", "a" * 8) == {"blob": b"x" * 1000}  # "a" was written first but is now the latest used
    fresh = BuildCache(tmp_path)  # a later process: nothing used yet
    result = fresh.prune(2500)
    assert _keys(tmp_path) == {"a", "d"}  # b and c were the least recently used
    assert (result.removed, result.freed_bytes, result.kept_bytes) == (2, 2000, 2000)


def test_prune_keeps_what_this_build_used_even_over_the_limit(tmp_path):
    _fill(tmp_path, {"a": 1000, "b": 1000})
    cache = BuildCache(tmp_path)
    cache.get("stage", "a" * 8)
    cache.put("stage", "e" * 8, {"blob": b"y" * 3000})
    result = cache.prune(0)
    assert _keys(tmp_path) == {"a", "e"}
    assert result.kept_bytes == 4000 and result.removed == 1


def test_prune_removes_crashed_builds_staging_folders_but_not_a_live_one(tmp_path):
    _fill(tmp_path, {"a": 10})
    bucket = tmp_path / "v1" / "stage" / "aa"
    crashed, live = bucket / ".deadbeef-crashed", bucket / ".cafe0000-live"
    for d in (crashed, live):
        d.mkdir()
        (d / "part").write_bytes(b"z" * 100)
    old = time.time() - STALE_TEMP_S - 60
    os.utime(crashed, (old, old))
    BuildCache(tmp_path).prune(10**9)
    assert not crashed.exists() and live.exists() and _keys(tmp_path) == {"a"}


def test_a_disabled_or_missing_cache_prunes_nothing(tmp_path):
    _fill(tmp_path, {"a": 10})
    assert BuildCache(tmp_path, enabled=False).prune(0).removed == 0 and _keys(tmp_path) == {"a"}
    assert BuildCache(tmp_path / "nowhere").prune(0).removed == 0


@pytest.mark.parametrize("raw", ["lots", "-1", "nan", "inf", ""])
def test_a_bad_size_limit_is_refused_with_what_to_set(monkeypatch, raw):
    monkeypatch.setenv("EDGEKIT_CACHE_MAX_GB", raw)
    with pytest.raises(ConfigError, match="EDGEKIT_CACHE_MAX_GB") as e:
        cache_limit_bytes()
    assert "GiB" in str(e.value) and e.value.hint


def test_the_size_limit_reads_gibibytes(monkeypatch):
    monkeypatch.delenv("EDGEKIT_CACHE_MAX_GB", raising=False)
    assert cache_limit_bytes() == 5 * 2**30
    monkeypatch.setenv("EDGEKIT_CACHE_MAX_GB", "0.5")
    assert cache_limit_bytes() == 2**29


def test_an_entry_removed_while_it_is_read_is_a_miss_not_a_crash(tmp_path, monkeypatch):
    _fill(tmp_path, {"a": 10})
    cache = BuildCache(tmp_path)
    entry = cache._entry("stage", "a" * 8)
    real_read = type(entry).read_bytes

    def read_then_vanish(path):  # another build's prune removes the entry between two reads
        data = real_read(path)
        (entry / ".complete").unlink(missing_ok=True)
        return data

    monkeypatch.setattr(type(entry), "read_bytes", read_then_vanish)
    assert cache.get("stage", "a" * 8) is None and cache.misses == ["stage"] and not cache.hits
    assert BuildCache(tmp_path).get("stage", "b" * 8) is None  # a plain miss is still one


def test_ctrl_c_while_an_entry_is_written_leaves_no_staging_folder(tmp_path, monkeypatch):
    from pathlib import Path

    from edgekit.cache import BuildCache

    cache = BuildCache(tmp_path)
    real = Path.write_bytes
    calls = []

    def interrupted(self, data):
        calls.append(self.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.put("quantize", "ab" * 32, {"model.safetensors": b"x" * 10, "report.json": b"{}"})
    assert [p for p in tmp_path.rglob("*") if p.is_file() or p.name.startswith(".")] == []
