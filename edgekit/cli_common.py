"""Shared CLI plumbing: one console, one error boundary, JSON output."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from edgekit.units import fmt_bytes  # noqa: F401  (re-exported for the commands)
from edgekit.measured_on import CPU, in_words

# Piped or redirected output is read by people and scripts in full: rich would cut it to 80 columns
# (or to an inherited COLUMNS) and shorten cells ("attentio…"), so off a terminal lines and tables
# take the width they need.
UNBOUNDED_WIDTH = 100_000


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=UNBOUNDED_WIDTH)


console = _console()
err_console = _console(stderr=True)


_JSON_PRINTED = []  # a document went out: a failure after it (verify's report, then exit 2) adds no second one


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (nothing else is printed there when --json is given). Strict JSON: a
    non-finite float (an exact match's infinite SNR) is null, not Infinity, which JSON readers refuse."""
    from edgekit.strict_json import strict_dumps

    sys.stdout.write(strict_dumps(data, indent=2) + "\n")
    _JSON_PRINTED.append(True)


def json_was_printed() -> bool:
    return bool(_JSON_PRINTED)


class Terminated(BaseException):
    """SIGTERM, turned into an exception by ``end_on_sigterm`` so that ``finally`` clean-ups run (as Ctrl-C's
    KeyboardInterrupt lets them); a BaseException, so no ``except Exception`` swallows it."""


TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a command ended by SIGTERM


def end_on_sigterm() -> None:
    """From now on SIGTERM ends the command through ``Terminated``: its default action killed the process where it
    stood, so clean-ups never ran and it exited -15 with nothing said."""
    import signal

    def terminated(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, terminated)


def note(text: str) -> None:
    """A non-fatal remark for the user (deprecations, fallbacks) on stderr, never on stdout."""
    err_console.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


def cli_precision(value: str, allowed) -> str:
    """--precision in the one vocabulary (edgekit.precision_names); old spellings print a note."""
    from edgekit.precision_names import parse_precision

    return parse_precision(value, allowed, warn=note)


def gate_line(gate: dict, measured_on: str = CPU) -> str:
    """The accuracy gate of a quantization report on one line: the verdict, each metric against its threshold and
    the layers kept in FP (the build summary once printed the gate's JSON cut at 300 characters)."""
    from edgekit.quant.judged_by import JUDGED_BY_KL, JUDGED_BY_TEXT

    m, c = gate.get("metrics") or {}, gate.get("config") or {}
    increase, by = m.get("judged_increase", m["perplexity_increase"]), m.get("judged_by") or JUDGED_BY_TEXT
    on = f" on {by}" if by == JUDGED_BY_KL else ""
    parts = [f"perplexity {100 * increase:+.2f}%{on} (at most {100 * c['max_ppl_increase']:+.2f}%)"]
    if m.get("greedy_agreement") is not None:
        parts.append(f"greedy agreement {100 * m['greedy_agreement']:.1f}% (at least {100 * c['min_greedy_agreement']:.1f}%)")
    parts.append(f"logits SNR {m['logits_snr_db']:.1f} dB (at least {c['min_logits_snr_db']:.1f} dB)")
    verdict = "passed" if gate.get("passed") else "FAILED"
    where = in_words(measured_on) + ("" if on else f", {by}")  # the KL's figure names what it judged
    return f"accuracy gate {verdict}: " + ", ".join(parts) + f" ({where})"


def head_embedding_line(he: dict) -> str:
    """One line of report.json's ``head_embedding`` (edgekit.quant.stored_bytes) for build, quantize and info."""
    return (f"LM head: {he['lm_head']}; embedding: {he['embedding']}; weight bytes per decoded token "
            f"{fmt_bytes(he['bytes_per_token'])} = {he['vs_fp16']:.3f} x FP16's {fmt_bytes(he['fp16_bytes_per_token'])} "
            f"(computed from the stored weights)")
