"""A device runs bundles without Triton, transformers or ONNX (the base install; docs/jetson.md).

Each check runs in a fresh process where those packages cannot be imported (a meta-path finder refuses them, as
a venv without them would): `verify` and `run` on the CPU, and every plugin of a bundle loaded and launched through
the device's plugin loader without a single Triton module imported (before, loading one plugin imported every
``*_triton`` module). scripts/check_wheel.sh repeats the CPU part in a real venv that lacks the packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HOST_ONLY = ("triton", "transformers", "onnx", "onnxruntime", "onnxscript", "gguf", "matplotlib")
PROBE = Path(__file__).with_name("plugin_loader_probe.py")


@pytest.fixture(scope="module")
def device_env(tmp_path_factory):
    """An environment whose Python cannot import the host-only packages."""
    d = tmp_path_factory.mktemp("device-site")
    (d / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {HOST_ONLY!r}\n"
        "class NotOnThisDevice:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotOnThisDevice())\n")
    return {**os.environ, "PYTHONPATH": str(d)}


def run(env, *argv, timeout=300):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)


def test_the_device_environment_really_lacks_triton(device_env):
    r = run(device_env, "-c", "import triton")
    assert r.returncode != 0 and "No module named 'triton'" in r.stderr


def test_verify_and_run_a_bundle_on_the_cpu_without_triton_transformers_or_onnx(device_env, tiny_bundle):
    r = run(device_env, "-m", "edgekit", "verify", str(tiny_bundle), "--allow-dev-key", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["ok"] is True
    r = run(device_env, "-m", "edgekit", "run", str(tiny_bundle), "--allow-dev-key", "-p", "hello", "-n", "4", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert len(out["token_ids"]) == 4 and out["backend"] == "reference"


def test_loading_and_launching_every_plugin_imports_no_triton_module(device_env, tiny_bundle):
    r = run(device_env, str(PROBE), str(tiny_bundle))
    assert r.returncode == 0, r.stderr[-3000:]
    probe = json.loads(r.stdout.strip().splitlines()[-1])
    assert probe["triton_modules"] == []
    assert {"rmsnorm", "attention_decode", "fused_norm_qkv_rope"} <= set(probe["plugins"]) and probe["launches"] > 0


def test_building_on_a_device_install_says_to_install_the_host_extra(device_env, tmp_path):
    r = run(device_env, "-m", "edgekit", "build", "preset:tiny", "--target", "orin", "--dev-key", "-o",
            str(tmp_path / "b"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("error: this command needs triton, which a device install leaves "
                                                 "out (install edgekit's host extra: pip install 'edgekit[host]')")
