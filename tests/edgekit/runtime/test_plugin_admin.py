"""StoreAdmin: the server-facing adapter and the fault-isolation loop around the runtime's loader."""

from __future__ import annotations

import pytest

import fakepkg
from edgekit.runtime.plugin_admin import StoreAdmin
from edgekit.runtime.plugin_policy import SwapRefused
from edgekit.runtime.plugin_store import PluginStore

AUTHOR = fakepkg.key_from_seed(1)


class Loader:
    """Records what the runtime was told to serve; refuses versions listed in `broken`."""

    def __init__(self, broken=()):
        self.broken = set(broken)
        self.serving: dict[str, str | None] = {}

    def __call__(self, op, plugin):
        version = None if plugin is None else str(plugin.version)
        if version in self.broken:
            raise RuntimeError(f"cuModuleLoadData failed for {version}")
        self.serving[op] = version


def make(tmp_path, loader):
    store = PluginStore.open(tmp_path / "s", policy=fakepkg.policy(), verify=fakepkg.verifier(AUTHOR),
                             golden_check=fakepkg.golden_check)
    return StoreAdmin(store, loader)


def test_install_and_rollback_tell_the_runtime(tmp_path):
    loader = Loader()
    admin = make(tmp_path, loader)
    assert admin.install(fakepkg.pack(AUTHOR, version=1))["version"] == 1
    admin.install(fakepkg.pack(AUTHOR, version=2))
    assert loader.serving == {"rmsnorm": "2"}
    assert admin.rollback("rmsnorm")["version"] == 1 and loader.serving == {"rmsnorm": "1"}
    assert admin.list()[0]["blocked"] == [2]


def test_a_plugin_that_fails_to_load_is_rolled_back_and_the_pointer_says_so(tmp_path):
    loader = Loader(broken={"2"})
    admin = make(tmp_path, loader)
    admin.install(fakepkg.pack(AUTHOR, version=1))
    with pytest.raises(SwapRefused) as e:
        admin.install(fakepkg.pack(AUTHOR, version=2))
    assert e.value.reason == "load_failed" and "cuModuleLoadData" in str(e.value)
    assert loader.serving == {"rmsnorm": "1"} and admin.store.pointer("rmsnorm").version == "1"


def test_sync_at_start_up_falls_back_until_something_loads(tmp_path):
    admin = make(tmp_path, Loader())
    admin.install(fakepkg.pack(AUTHOR, version=1))
    admin.install(fakepkg.pack(AUTHOR, version=2))
    loader = Loader(broken={"1", "2"})  # e.g. a driver update broke both cubins
    restarted = StoreAdmin(admin.store, loader)
    assert restarted.sync() == {"rmsnorm": None}
    assert loader.serving == {"rmsnorm": None}
