"""A fused decode operator is a plugin like any other: `plugin pack --kernel-source` makes a signed package of it for
a bundle, and the device's store verifies (signature, ABI, golden vectors), stages and swaps it in."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.builder.kernel_source import pack_from_kernel_source
from edgekit.bundle.keys import development_key
from edgekit.errors import OperatorError
from edgekit.graph.builder import LinearSchemes
from edgekit.graph.paths import fused_step_operators
from edgekit.kernels.registry import operator
from edgekit.model.presets import preset_config

OP = "fused_proj_residual"
SHIPPED = Path(operator(OP).kernels.kernels[0].fn.fn.__code__.co_filename)  # kernels/fused_proj_residual_triton.py


def _source(tmp_path: Path, old: str = "", new: str = "") -> Path:
    text = SHIPPED.read_text()
    if old:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "my_proj_residual.py"
    path.write_text(text)
    return path


def test_the_tiny_bundle_ships_every_fused_operator_of_its_fused_step(tiny_bundle):
    cfg = preset_config("tiny")
    for op in fused_step_operators(cfg, LinearSchemes.uniform(cfg.n_layers)):
        assert (tiny_bundle / "plugins" / op / "1" / "plugin.json").is_file(), op


def test_a_fused_operator_packed_from_kernel_source_swaps_in_over_the_air(tiny_bundle, tiny_stack, tmp_path):
    meta, package = pack_from_kernel_source(tiny_bundle, OP, _source(tmp_path), version=2, key=development_key())
    assert meta.op == OP and len(meta.kernels) == len(operator(OP).kernels.kernels)  # the float and the W8A16 kernel
    result = tiny_stack.admin.install(package)
    assert result["op"] == OP and result["version"] == 2, result
    assert tiny_stack.engine.table.sources()[OP].startswith("plugin:v2")
    assert tiny_stack.engine.complete([3, 4, 5], 3).token_ids  # the engine keeps serving after the swap


def test_a_fused_kernel_source_that_changes_the_abi_is_refused(tiny_bundle, tmp_path):
    src = _source(tmp_path, '"proj_residual"', '"proj_residual_fast"')
    with pytest.raises(OperatorError, match="differ from edgekit's"):
        pack_from_kernel_source(tiny_bundle, OP, src, version=2, key=development_key())
