"""The `edgekit` command line.

Each command lives next to the code it drives (``edgekit/commands/*.py``) and
registers itself on ``app``; this module adds the global options and the error
boundary: an ``EdgekitError`` becomes one red line on stderr and a non-zero
exit code, never a traceback.
"""

from __future__ import annotations

import os
import sys

import typer
import typer.main
from rich.markup import escape

from edgekit import __version__
from edgekit.cli_common import TERMINATED_EXIT_CODE, Terminated, err_console, json_was_printed
from edgekit.cli_raw_values import guard_raw_values
from edgekit.cli_usage import ClickException, show_usage_error, usage_line
from edgekit.errors import EdgekitError

app = typer.Typer(
    name="edgekit",
    help="Package transformer models for Jetson Orin, swap operators over the air, watch latency and power.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help wraps each flag's text beside its name at any width; typer's rich panels cut the names
    # themselves at 80 columns (`--admin-token-fi…`) once the type and default columns had taken their share
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"edgekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """edgekit: build for Orin on any host, swap one operator over the air, watch power and jitter on the device."""


# Each module adds its commands to `app` when imported; one module per area.
COMMAND_MODULES = (
    "edgekit.commands.model_commands",
    "edgekit.commands.plan_commands",
    "edgekit.commands.quant_commands",
    "edgekit.commands.build_commands",
    "edgekit.commands.power_commands",
    "edgekit.commands.ota_commands",
    "edgekit.commands.plugin_commands",
    "edgekit.commands.bench_commands",
)


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name)


def _value_name(param, ctx) -> str:
    """A short name for what an option takes (PATH, INT, NUM, TEXT): typer's own (`<list[Path]>`, `<float range>`)
    took so many of 80 columns that rich cut the flag names themselves (`--admin-token-fi…`)."""
    display = getattr(param, "display_type", None)  # typer 0.2x's own click; an older typer runs click's options
    shown = ((display(ctx) if callable(display) else getattr(param.type, "name", "")) or "").lower()
    for word, name in (("path", "PATH"), ("file", "PATH"), ("directory", "PATH"), ("int", "INT"), ("float", "NUM")):
        if word in shown:
            return name
    return "TEXT"


def _tidy_help_columns(command) -> None:
    """Help that reads like click's: an argument by its name in capitals, an option by a short value name, a flag
    by nothing (typer 0.2x showed `<bool>`)."""
    ctx = typer.Context(command)
    help_option = command.get_help_option(ctx)  # made (and cached) on first use
    for param in [*getattr(command, "params", []), *([help_option] if help_option is not None else [])]:
        if param.metavar is not None:
            continue
        if getattr(param, "param_type_name", "") == "argument":  # `BUNDLE`, not `{bundle}` / `bundle <path>`
            param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
        elif not getattr(param, "is_flag", False):
            param.metavar = _value_name(param, ctx)
    for sub in (getattr(command, "commands", None) or {}).values():
        _tidy_help_columns(sub)


def cli_command():
    """The click command tree of `edgekit`, every command registered and help cleaned up."""
    _register_commands()
    command = typer.main.get_command(app)
    _tidy_help_columns(command)
    guard_raw_values(command)
    return command


# What the `host` extra adds to a device install (pyproject.toml): commands that build need them, devices do not.
HOST_EXTRA_PACKAGES = frozenset({"triton", "transformers", "gguf", "onnx", "onnxruntime", "onnxscript", "matplotlib"})
ABORTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def _json_on_stdout(argv: list[str]) -> bool:
    """Whether the command asked for JSON on stdout (``--json``); ``bench``'s ``--json`` names a file instead."""
    words = [a for a in argv if not a.startswith("-")]
    return "--json" in argv and (not words or words[0] != "bench")


def _json_error(kind: str, message: str, hint: str | None, exit_code: int) -> None:
    """Where the command was asked for JSON on stdout and printed none, a script reading it gets a document, not
    nothing: one line (JSON-lines streams such as `power monitor --json` stay one object a line)."""
    if _json_on_stdout(sys.argv[1:]) and not json_was_printed():
        import json

        print(json.dumps({"ok": False, "error": {"type": kind, "message": message, "hint": hint,
                                                 "exit_code": exit_code}}))


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # OpenMP workers that spin while they wait are a disaster on a shared or busy CPU: measured on the 2-core
    # development machine under load ~8, a 135M-parameter decode step took 4.7 s with spinning threads and
    # 0.44 s with passive ones. Set before torch loads its OpenMP runtime (commands import torch lazily).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        # Under standalone_mode=False typer turns Ctrl-C into Exit(130) and `raise typer.Exit(n)` into n, and
        # *returns* that code instead of exiting: it must not be dropped (`edgekit build ... && deploy`).
        code = cli_command().main(prog_name="edgekit", standalone_mode=False)
    except EdgekitError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        _json_error(type(e).__name__, e.message, e.hint, e.exit_code)
        sys.exit(e.exit_code)
    except ClickException as e:  # usage errors: unknown flag or command, missing argument, bad value
        code = show_usage_error(e, err_console)
        _json_error("UsageError", usage_line(e), None, code)
        sys.exit(code)
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", getattr(e, "code", 0))
    except (typer.Abort, KeyboardInterrupt):  # interrupted before or after typer's own handler
        code = ABORTED_EXIT_CODE
    except Terminated:  # SIGTERM where a command asked for it to end the command (cli_common.end_on_sigterm)
        err_console.print("terminated", highlight=False)
        _json_error("Terminated", "terminated (SIGTERM before the command finished)", None, TERMINATED_EXIT_CODE)
        sys.exit(TERMINATED_EXIT_CODE)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in HOST_EXTRA_PACKAGES:
            raise
        # a device install (no `host` extra) asked to do host work: say what to install, not a traceback
        err_console.print("[bold red]error:[/] " + escape(f"this command needs {missing}, which a device install "
                                                          "leaves out (install edgekit's host extra: pip install "
                                                          "'edgekit[host]')"), highlight=False, soft_wrap=True)
        sys.exit(2)
    if code == ABORTED_EXIT_CODE:
        err_console.print("aborted", highlight=False)
        # a script reading --json got nothing at all from an interrupted command (`timeout -s INT`, Ctrl-C)
        _json_error("Aborted", "aborted (interrupted before the command finished)", None, ABORTED_EXIT_CODE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # run as `python -m edgekit` instead: this module must be imported as edgekit.cli
    from edgekit.cli import main as _main

    _main()
