"""#32 row 7: logs that cannot take the API down or fill the disk.

Before: a log write that failed (disk full, ``--log /dev/full``) raised into the request, so every completion,
even a 401, became a 500; logs grew without bound (a 429 flood ~40 KB/s, the watchdog 13 MB in 45 min) with the
umask's mode. Now: a failed write is counted and dropped; the file is rotated at a size cap with a few old ones
kept; log files are 0600."""

from __future__ import annotations

import json
import stat

from edgekit.power.jsonl import JsonlLogger


def test_a_full_device_drops_records_and_counts_them_without_raising():
    log = JsonlLogger("/dev/full", flush_interval_s=0.0)
    for i in range(5):
        log.write({"type": "event", "i": i})
    log.write({"type": "event", "i": 5}, flush=True)
    log.close()
    assert log.records == 6 and log.dropped == 6 and "No space left" in (log.last_error or "")


def test_a_flood_of_records_stays_under_the_cap_in_rotated_files(tmp_path):
    path = tmp_path / "server.jsonl"
    log = JsonlLogger(path, flush_interval_s=0.0, max_bytes=20_000, backups=2)
    for i in range(5_000):  # ~100 bytes each: 500 KB asked for
        log.write({"type": "request", "route": "completions", "status": 429, "i": i, "pad": "x" * 40})
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["server.jsonl", "server.jsonl.1", "server.jsonl.2"]
    assert all(f.stat().st_size <= 20_000 for f in files) and log.rotations > 2 and log.dropped == 0
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    last = [json.loads(line) for line in path.read_text().splitlines()]
    assert last[-1]["i"] == 4_999 and [r["i"] for r in last] == list(range(last[0]["i"], 5_000))  # whole lines, in order


def test_an_existing_log_with_an_open_mode_is_narrowed_to_0600(tmp_path):
    path = tmp_path / "watchdog.jsonl"
    path.write_text("")
    path.chmod(0o644)
    with JsonlLogger(path) as log:
        log.write({"type": "event"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_records_are_strict_json_lines_and_read_back(tmp_path):
    """The log wrote Python's NaN token (an attach-mode jitter event's window statistics, which a scrape does not
    have), so `jq` and every non-Python reader refused the line. Non-finite values are null; read_log and
    `edgekit report`'s reader give them back as None."""
    import math

    from edgekit.power.jsonl import read_log

    path = tmp_path / "monitor.jsonl"
    log = JsonlLogger(path, flush_interval_s=0.0)
    log.write({"type": "event", "t_s": 1.0, "kind": "jitter", "evidence": {"mean_ms": math.nan, "max_ms": math.inf}})
    log.close()

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    lines = path.read_text().splitlines()
    assert [json.loads(line, parse_constant=refuse)["evidence"] for line in lines] == [{"mean_ms": None, "max_ms": None}]
    assert read_log(path).events[0]["evidence"] == {"mean_ms": None, "max_ms": None}
