"""Attack 7: after a rollback to the reference, an older signed version installed without allow_downgrade.

Before: with nothing active there was nothing to compare with. Now: the store keeps a version floor (the newest
version ever installed) that rollbacks do not lower."""

from __future__ import annotations

import httpx
import pytest

from runtime_helpers import plugin_packages


def test_older_version_after_rollback_to_the_reference_is_a_downgrade(tiny_server, tiny_bundle):
    url, stack, auth = tiny_server
    v5, v3, v7 = plugin_packages(tiny_bundle, "swiglu", [5, 3, 7])
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        assert c.post("/v1/plugins", files={"file": ("p.tar", v5)}).status_code == 200
        assert c.post("/v1/plugins/swiglu/rollback").status_code == 200
        assert stack.store.pointer("swiglu").version is None  # the reference (the bundle's own) serves again
        r = c.post("/v1/plugins", files={"file": ("p.tar", v3)})
        assert r.status_code == 422 and "older than 5" in r.json()["error"]["message"], r.text
        assert stack.store.pointer("swiglu").version is None
        assert c.post("/v1/plugins", files={"file": ("p.tar", v7)}).status_code == 200  # newer still installs
        assert c.post("/v1/plugins/swiglu/rollback").status_code == 200
        r = c.post("/v1/plugins", params={"allow_downgrade": "true"}, files={"file": ("p.tar", v3)})
        assert r.status_code == 200, r.text  # on purpose, it still can
    assert stack.store.pointer("swiglu").floor == "7"


def test_the_floor_survives_a_restart(tiny_bundle, tmp_path):
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.plugin_policy import SwapRefused
    from edgekit.runtime.serving import open_store

    b = open_bundle(tiny_bundle, [], allow_dev_key=True, device="cpu", golden=False)
    store = open_store(tmp_path / "store", b, [], allow_dev_key=True)
    v4, v2 = plugin_packages(tiny_bundle, "rmsnorm", [4, 2])
    store.install(v4)
    store.confirm("rmsnorm")
    store.rollback("rmsnorm")
    store.close()  # the runtime stopped: its claim on the store is released
    reopened = open_store(tmp_path / "store", b, [], allow_dev_key=True)
    with pytest.raises(SwapRefused) as refused:
        reopened.install(v2)
    assert refused.value.reason == "downgrade"


def test_a_signed_plugin_of_the_bundles_own_version_cannot_replace_the_bundles_own(tiny_server, tiny_bundle):
    """#32 row 12: rmsnorm v1 (the version the bundle ships) uploaded to a fresh store was accepted and replaced the
    bundle's own plugin. Now the bundle's version counts in the downgrade check, on a store that never saw it."""
    url, stack, auth = tiny_server
    assert stack.store.bundle_plugins["rmsnorm"] == "1"
    before = stack.engine.table.sources()["rmsnorm"]
    same = plugin_packages(tiny_bundle, "rmsnorm", [1])[0]
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        r = c.post("/v1/plugins", files={"file": ("p.tar", same)})
        assert r.status_code == 422 and "downgrade" in r.json()["error"]["message"], r.text
        assert stack.store.pointer("rmsnorm").version is None and stack.engine.table.sources()["rmsnorm"] == before
        assert c.post("/v1/plugins", files={"file": ("p.tar", plugin_packages(tiny_bundle, "rmsnorm", [2])[0])}
                      ).status_code == 200  # a newer one still installs
    assert stack.store.pointer("rmsnorm").version == "2"
    assert before.startswith("plugin:v1") or before == "reference", before


def test_a_rollback_of_an_operator_nobody_has_is_404_a_malformed_name_400_and_one_on_the_reference_409(tiny_server):
    """The route answered 409 (a conflict with the store's state) for a typo in the operator's name too, so a
    script could not tell "no such operator" from "nothing to roll back"."""
    url, stack, auth = tiny_server
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        r = c.post("/v1/plugins/swigluu/rollback")
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert "unknown operator 'swigluu'" in error["message"] and "swiglu" in error["message"], error
        assert error["param"] == "op"
        r = c.post("/v1/plugins/Swi-Glu/rollback")
        assert r.status_code == 400 and "not a lower-case identifier" in r.json()["error"]["message"], r.text
        r = c.post("/v1/plugins/swiglu/rollback")  # nothing installed: the bundle's own plugin serves it
        assert r.status_code == 200, r.text
        r = c.post("/v1/plugins/swiglu/rollback")
        assert r.status_code == 409 and "nothing to roll back" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] is None
    assert stack.store.pointer("swiglu").version is None
