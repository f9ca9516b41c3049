"""Values refused as typed, before typer converts them, on every parameter of a kind (put in place as the command
tree is built, so a new command's parameters get it too).

- A path given as "" (or blanks): typer turned it into Path('.'), so `keys generate "$DIR"` with DIR unset wrote a
  private key into the current directory, and `report LOG -o ''` its files there too.
- A number given as nan or inf: `serve --max-queue-wait-ms inf` passed its `min` and turned the deadline off, `nan`
  was refused as "Input should be greater than or equal to 1", and an option without bounds took either.
"""

from __future__ import annotations

import math
import pathlib
import typing

from edgekit.cli_usage import BadParameter

EMPTY_PATH_MESSAGE = "an empty path (an unset shell variable?); name a file or directory (. for this one)"


def _annotated(param, kind: type) -> bool:
    """Whether typer converts this parameter's values to ``kind`` (X, Optional[X], List[X])."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return any(isinstance(k, type) and issubclass(k, kind) for k in (annotation, *typing.get_args(annotation)))


def takes_paths(param) -> bool:
    return _annotated(param, pathlib.PurePath)


def takes_floats(param) -> bool:
    return _annotated(param, float)


def _not_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False  # not a number at all: typer's own message says so


def raw_value_problem(param, text: str) -> str | None:
    """Why ``text``, as typed for ``param``, is refused; None where typer may convert it."""
    if takes_paths(param) and not text.strip():
        return EMPTY_PATH_MESSAGE
    if takes_floats(param) and _not_finite(text):
        return f"got {text!r}; expected a finite number"
    return None


def guard_raw_values(command) -> None:
    """Every path and number parameter of ``command`` and its subcommands refuses what raw_value_problem names."""
    for param in getattr(command, "params", []):
        if not (takes_paths(param) or takes_floats(param)):
            continue
        process = param.process_value

        def checked(ctx, value, process=process, param=param):
            for text in value if isinstance(value, (list, tuple)) else (value,):
                problem = raw_value_problem(param, text) if isinstance(text, str) else None
                if problem:
                    raise BadParameter(problem, ctx=ctx, param=param)
            return process(ctx, value)

        param.process_value = checked
    for sub in (getattr(command, "commands", None) or {}).values():
        guard_raw_values(sub)
