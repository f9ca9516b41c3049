"""An upload to a server without a GPU says the plugin's kernels went unchecked, in its answer and in server.jsonl:
the golden vectors ran the torch reference there (issue 33: a kernel 1% wrong was "accepted", nothing said so)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from runtime_helpers import plugin_packages


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the golden check runs the kernels themselves")
def test_uploading_a_plugin_to_a_cpu_server_answers_and_logs_that_its_kernels_were_not_run(tiny_server, tiny_bundle):
    url, stack, auth = tiny_server
    package = plugin_packages(tiny_bundle, "rmsnorm", [2])[0]
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/plugins", headers=auth, files={"file": ("rmsnorm-v2.tar", package)})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["op"], answer["version"], answer["state"]) == ("rmsnorm", 2, "probation")
    assert answer["golden_check"]["kernels_checked"] is False
    assert answer["golden_check"]["ran"] == "the torch reference on the CPU"
    assert "unchecked" in answer["golden_check"]["note"]
    stack.log.close()
    records = [json.loads(line) for line in (stack.store.root / "server.jsonl").read_text().splitlines()]
    unchecked = [r for r in records if r.get("kind") == "plugin_kernels_unchecked"]
    assert len(unchecked) == 1 and (unchecked[0]["op"], unchecked[0]["version"]) == ("rmsnorm", 2)
    assert "not this plugin's kernels" in unchecked[0]["detail"]


def test_a_golden_check_that_runs_the_kernels_says_so():
    from edgekit.runtime.plugin_checks import gpu_runner, golden_check_summary, golden_checker, reference_runner

    assert golden_check_summary(golden_checker(gpu_runner()))["kernels_checked"] is True
    assert golden_check_summary(golden_checker(reference_runner))["kernels_checked"] is False
