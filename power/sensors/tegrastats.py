"""Parse ``tegrastats`` lines, leniently, across JetPack releases.

One line per interval, e.g. (AGX Orin, JetPack 5.1)::

    11-21-2025 08:49:48 RAM 13983/62780MB (lfb 424x4MB) SWAP 126/31390MB (cached 0MB)
    CPU [90%@2201,...,off] EMC_FREQ 1%@2133 GR3D_FREQ 14%@[407,407] ... GPU@69.125C
    tj@77.281C CV0@-256C ... VDD_GPU_SOC 3150mW/2971mW VDD_CPU_CV 14312mW/12415mW ...

What drifts between releases and is handled here: the leading timestamp (absent
before JetPack 5.1), GR3D as ``14%@[407,407]``, ``10%@1300``, a bare ``0%`` or a
clock without a load (``@[1000,1000]``), upper- or lower-case temperature names,
temperatures as ``cpu@52.968C/52.968C`` (JetPack 7: the first value is used),
rails printed as ``now/avg`` in mW, as three values (JetPack 7: ``now/avg/third``,
the third kept as printed because no source we have documents it) or without
units (JetPack 4: ``POM_5V_IN 2027/2027``). Zones that print a fixed placeholder
(``PMIC@100C`` on JetPack 4 boards) go to ``placeholder_temps_c``, not to the
temperatures the policy watches. The total is the input rail where the board
measures one; otherwise a labelled sum of the named rails (``rails_sum_mw``).
Every field is matched on its own, so an unknown or truncated token costs that
field only; a line with no recognisable field is reported as skipped.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.power.sample import PowerSample, set_power_totals
from edgekit.power.sensors.thermal import is_placeholder_temp, valid_temp_c, zone_name

_TIMESTAMP = re.compile(r"^\s*(\d{2})-(\d{2})-(\d{4}) (\d{2}):(\d{2}):(\d{2})\b")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_CPU_CORE = re.compile(r"^(\d+)%")
_GR3D = re.compile(r"\bGR3D(?:_FREQ)? (?:(\d+)%)?(?:@\[?(\d+))?")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_TEMP = re.compile(r"(?<![\w%])([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C(?:/-?\d+(?:\.\d+)?C)*(?=\s|$)")
# NAME now[mW][/avg[mW]][/max[mW]]: a rail needs the mW unit or a slash, so that
# "APE 174" or "VIC_FREQ 729" are not taken for rails; RAM/SWAP end in MB and fail.
_RAIL = re.compile(r"(?<![\w@%/])([A-Za-z][A-Za-z0-9_]*) (\d+)(mW)?((?:/\d*(?:mW)?)*)(?=\s|$)")
_NOT_RAILS = {"RAM", "SWAP", "IRAM", "LFB", "CACHED"}


def parse_line(line: str, t_s: float | None = None) -> PowerSample | None:
    """One tegrastats line -> a sample, or None when nothing in it is recognisable.

    ``t_s`` is used when the line has no timestamp of its own. A line's
    timestamp is the board's local time without a zone; it is read as if UTC,
    which keeps intervals right (the report plots relative time).
    """
    ts = _timestamp(line)
    s = PowerSample(t_s=ts if ts is not None else (t_s if t_s is not None else time.time()), source="tegrastats")
    found = False

    m = _RAM.search(line)
    if m:
        s.mem_used_mb, s.mem_total_mb = float(m.group(1)), float(m.group(2))
        found = True
    m = _CPU.search(line)
    if m:
        loads = [int(c.group(1)) for c in (_CPU_CORE.match(x.strip()) for x in m.group(1).split(",")) if c]
        if loads:  # cores printed as "off" are offline and do not count
            s.cpu_load_pct = sum(loads) / len(loads)
            found = True
    m = _GR3D.search(line)
    if m and (m.group(1) or m.group(2)):
        if m.group(1):
            s.gpu_load_pct = float(m.group(1))
        if m.group(2):
            s.gpu_freq_mhz = float(m.group(2))
        found = True
    m = _EMC.search(line)
    if m:
        s.emc_load_pct = float(m.group(1))
        if m.group(2):
            s.emc_freq_mhz = float(m.group(2))
        found = True
    for m in _TEMP.finditer(line):
        c, zone = float(m.group(2)), zone_name(m.group(1))
        if is_placeholder_temp(zone, c):
            s.placeholder_temps_c.setdefault(zone, c)
        elif valid_temp_c(c):  # -256 C: the zone's block is powered off
            s.temps_c.setdefault(zone, c)
        found = True
    for m in _RAIL.finditer(line):
        name, now, unit, rest = m.group(1), m.group(2), m.group(3), m.group(4)
        if name.upper() in _NOT_RAILS or not (unit or any(ch.isdigit() for ch in rest)):
            continue
        if name not in s.rails_mw:
            s.rails_mw[name] = float(now)
            more = [float(v.removesuffix("mW")) for v in rest.split("/")[1:] if v.removesuffix("mW").isdigit()]
            if more:
                s.rails_avg_mw[name] = more[0]
            if len(more) > 1:
                s.rails_third_mw[name] = more[1]
        found = True
    if not found:
        return None
    set_power_totals(s)
    if not s.rails_mw:
        s.reason = "no power rails in this line"
    return s


def _timestamp(line: str) -> float | None:
    m = _TIMESTAMP.match(line)
    if not m:
        return None
    mo, d, y, hh, mm, ss = (int(g) for g in m.groups())
    try:
        return float(calendar.timegm((y, mo, d, hh, mm, ss, 0, 0, 0))) if 1 <= mo <= 12 and 1 <= d <= 31 else None
    except (ValueError, OverflowError):
        return None


@dataclass
class ReplayResult:
    samples: list[PowerSample] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)  # 1-based line numbers with nothing recognisable


def parse_lines(lines: Iterable[str], interval_s: float = 1.0) -> Iterator[tuple[int, PowerSample | None]]:
    """(line number, sample or None) for each non-empty line.

    Lines without a timestamp are placed ``interval_s`` after the previous
    sample (the first at 0 s), which is how ``tegrastats --interval`` wrote them.
    """
    last_t: float | None = None
    for n, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        guess = 0.0 if last_t is None else last_t + interval_s
        s = parse_line(line, t_s=guess)
        if s is not None:
            last_t = s.t_s
        yield n, s


def replay_log(path: str | Path, interval_s: float = 1.0) -> ReplayResult:
    """Every sample of a recorded tegrastats log (undecodable bytes are replaced, not fatal)."""
    out = ReplayResult()
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, s in parse_lines(f, interval_s):
            if s is None:
                out.skipped_lines.append(n)
            else:
                out.samples.append(s)
    return out
