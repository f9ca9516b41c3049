"""Usage errors (unknown flag, missing argument, bad value, unknown command) as one line, exit 2.

The installed typer vendors its own copy of click, so its usage errors are not
``click.ClickException``: the classes come from typer's copy when it has one
(typer >= 0.2x), else from click itself (older typer).
"""

from __future__ import annotations

import sys

try:  # typer 0.2x: a private copy of click
    from typer._click import exceptions as _click_exceptions
except ImportError:  # older typer re-uses the click package
    from click import exceptions as _click_exceptions  # type: ignore[no-redef]

ClickException = _click_exceptions.ClickException
UsageError = _click_exceptions.UsageError
NoSuchOption = _click_exceptions.NoSuchOption
BadParameter = _click_exceptions.BadParameter
NoArgsIsHelpError = getattr(_click_exceptions, "NoArgsIsHelpError", None)

USAGE_EXIT_CODE = 2


def usage_line(e: ClickException) -> str:
    """One line: the problem, the closest valid flag (when click found one), where to get help."""
    msg = " ".join(e.format_message().split()).rstrip(".")  # click's messages may hold newlines
    if isinstance(e, NoSuchOption) and e.possibilities:
        msg = f"no such option {e.option_name}; did you mean {' or '.join(sorted(e.possibilities))}?"
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path if ctx is not None else "edgekit"
    return f"{msg[:1].lower()}{msg[1:]} (see `{command} --help`)"


def show_usage_error(e: ClickException, err_console) -> int:
    """Print a click/typer error the user caused and return the exit code to use.

    A group called with no command prints its help (there is nothing to name as wrong)."""
    if NoArgsIsHelpError is not None and isinstance(e, NoArgsIsHelpError):
        text = e.format_message().strip()  # typer's rich help has already been printed; plain click's has not
        if text:
            sys.stderr.write(text + "\n")
        return USAGE_EXIT_CODE
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(usage_line(e))}", highlight=False, soft_wrap=True)
    return e.exit_code if isinstance(e, UsageError) else 1
