"""One error hierarchy for everything edgekit refuses.

Every message says what was received, what was expected and how to fix it. The
CLI prints ``str(error)`` on one line and exits non-zero; it never shows a
traceback for an ``EdgekitError``.
"""

from __future__ import annotations


class EdgekitError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")


class ModelLoadError(EdgekitError):
    """A model file, directory or preset could not be loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model is readable but its architecture is not one edgekit runs."""


class OutputPathError(EdgekitError):
    """An output path that cannot be written (a file where a directory is needed, no permission, read-only)."""


class ShapeError(EdgekitError):
    """An input does not fit the static shapes (buckets, KV cache length, batch)."""


class OperatorError(EdgekitError):
    """An operator was called with tensors that do not match its spec."""


class NumericFaultError(EdgekitError):
    """An operator produced non-finite values (NaN or inf) where a served answer depends on them."""


class ConfigError(EdgekitError):
    """A configuration document (target YAML, override file, ...) is invalid."""


class PlanError(EdgekitError):
    """The model does not fit the target as asked."""


class ExportError(EdgekitError):
    """A graph could not be exported (ONNX) or the exported graph does not run or match the reference."""


class BundleError(EdgekitError):
    """A bundle or plugin failed verification."""


class QuantizationError(EdgekitError):
    """Quantization failed or did not pass its accuracy gate."""


class SensorError(EdgekitError):
    """A power or latency sensor could not be read."""


class VerificationError(BundleError):
    """A signed artifact (bundle, archive, plugin package, key file) was refused.

    ``file`` names the offending file (or archive member) and ``reason`` says why,
    so callers can report both separately (tables, JSON).
    """

    def __init__(self, file: str, reason: str, *, hint: str | None = None):
        self.file = file
        self.reason = reason
        super().__init__(f"{file}: {reason}", hint=hint)


class BenchmarkError(EdgekitError):
    """A benchmark cannot run as asked (no GPU, a bundle where a model is needed, settings out of range)."""
