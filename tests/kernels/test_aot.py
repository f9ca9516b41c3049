"""kernels/aot.py's ptxas report (registers, spills): kept in Triton's cache by the PTX it describes, so the same
kernel's second report costs no ptxas run, another kernel's is its own, and an entry that is not what was written is
a miss, never an answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

from edgekit.kernels import aot  # noqa: E402
from edgekit.kernels.variants import default_variants  # noqa: E402


@pytest.fixture()
def triton_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path / "triton"


def _ptx(op: str = "rmsnorm", **shape) -> str:
    v = next(iter(default_variants(op, **shape).values()))
    return aot.compile_variant(v, 87, with_ptxas_stats=False).ptx


def _counting_ptxas(monkeypatch) -> list:
    runs = []
    real = aot._run_ptxas_stats

    def run(*args):
        runs.append(args[1])
        return real(*args)

    monkeypatch.setattr(aot, "_run_ptxas_stats", run)
    return runs


def test_a_kernels_second_report_comes_from_the_cache_without_running_ptxas(triton_cache, monkeypatch):
    runs = _counting_ptxas(monkeypatch)
    ptx = _ptx()
    first = aot._ptxas_stats(ptx)
    regs, spills = first
    assert type(regs) is int and regs > 0 and spills == {"stores": 0, "loads": 0}  # ptxas's own report
    assert runs == ["sm_87"]
    assert aot._ptxas_stats(ptx) == first and runs == ["sm_87"]  # kept: no second run
    entries = list(triton_cache.rglob(aot._STATS_FILE))
    assert len(entries) == 1 and json.loads(entries[0].read_text()) == {"registers": regs, "spills": spills}


def test_another_kernel_gets_its_own_report(triton_cache, monkeypatch):
    runs = _counting_ptxas(monkeypatch)
    a, b = _ptx(), _ptx("swiglu")
    assert a != b
    aot._ptxas_stats(a)
    aot._ptxas_stats(b)
    assert len(runs) == 2 and len(list(triton_cache.rglob(aot._STATS_FILE))) == 2


@pytest.mark.parametrize("kept", ["not json", "[]", "{}", '{"registers": null, "spills": null}',
                                  '{"registers": 40, "spills": null}', '{"registers": -1, "spills": null}',
                                  '{"registers": 40, "spills": {"stores": 0}}',
                                  '{"registers": "40", "spills": {"stores": 0, "loads": 0}}',
                                  '{"registers": 40, "spills": {"stores": 0, "loads": 0}, "more": 1}'])
def test_an_entry_that_is_not_what_was_written_is_a_miss_and_is_replaced(triton_cache, monkeypatch, kept):
    runs = _counting_ptxas(monkeypatch)
    ptx = _ptx()
    want = aot._ptxas_stats(ptx)
    entry = next(triton_cache.rglob(aot._STATS_FILE))
    entry.write_text(kept)
    assert aot._ptxas_stats(ptx) == want and len(runs) == 2  # ptxas asked again, its answer kept
    assert json.loads(entry.read_text()) == {"registers": want[0], "spills": want[1]}


def test_a_cache_that_cannot_be_written_still_answers(tmp_path, monkeypatch):
    ptx = _ptx()
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocked / "triton"))  # under a file: no folder can be made
    runs = _counting_ptxas(monkeypatch)
    assert aot._ptxas_stats(ptx)[0] > 0 and aot._ptxas_stats(ptx)[0] > 0 and len(runs) == 2


def test_a_failed_ptxas_run_is_not_kept(triton_cache, monkeypatch):
    ptx = _ptx()
    monkeypatch.setattr(aot, "_run_ptxas_stats", lambda *a: ((40, None), False))  # as when ptxas exits non-zero
    assert aot._ptxas_stats(ptx) == (40, None)
    assert not list(triton_cache.rglob(aot._STATS_FILE))


def test_another_ptxas_binary_is_another_key(tmp_path):
    ptxas = tmp_path / "ptxas"
    ptxas.write_bytes(b"one")
    first = aot._stats_key(str(ptxas), "ptx")
    ptxas.write_bytes(b"other")  # another size (and time): an upgraded ptxas reports afresh
    assert aot._stats_key(str(ptxas), "ptx") != first
    assert aot._stats_key(str(ptxas), "ptx 2") != aot._stats_key(str(ptxas), "ptx")


@pytest.mark.parametrize("switch", ["TRITON_ALWAYS_COMPILE", "EDGEKIT_NO_COMPILE_CACHE"])
def test_the_recompile_switches_skip_the_kept_reports(triton_cache, monkeypatch, switch):
    ptx = _ptx()
    runs = _counting_ptxas(monkeypatch)
    aot._ptxas_stats(ptx)
    monkeypatch.setenv(switch, "1")
    aot._ptxas_stats(ptx)
    assert len(runs) == 2 and len(list(triton_cache.rglob(aot._STATS_FILE))) == 1
