"""scripts/test_gpu.sh, the GPU suite's runner, on this machine: which files it runs, and what its report may claim.

Without a GPU every GPU test skips (a file "passes"), which is enough to check the bookkeeping: a resumed run keeps
the files an earlier run passed (whose reports hold every test collected now) and runs only the rest, and a report
left in the output folder by an earlier run is never read as this run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FEEDBACK, NVML = "tests/kernels/test_decode_feedback.py", "tests/power/test_nvml.py"

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="checks the runner's bookkeeping where GPU tests skip"),
    # without the repo's .venv the script sets up the GPU machine's environment instead (tools/gpu_setup.sh)
    pytest.mark.skipif(not (ROOT / ".venv/bin/python").exists(), reason="needs the repo's .venv (scripts/setup.sh)"),
]


def _suite(out: Path, **env) -> tuple[subprocess.CompletedProcess, dict]:
    settings = {"OUT": str(out), "FILES": f"{FEEDBACK} {NVML}", "JOBS": "2", "RESUME": "0", "BUDGET_S": "470", **env}
    run = subprocess.run(["bash", str(ROOT / "scripts/test_gpu.sh")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, **settings})
    return run, json.loads((out / "test_gpu" / "test_gpu.json").read_text())


def _files_run(run: subprocess.CompletedProcess) -> set[str]:
    return {line.split(":")[0].strip() for line in run.stdout.splitlines() if ": rc " in line}


def test_a_resumed_run_keeps_the_files_that_passed_and_runs_the_rest(tmp_path):
    first, doc = _suite(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _files_run(first) == {FEEDBACK, NVML} and doc["kept_from_earlier_run"] == []
    n_tests = len(doc["tests"])
    # the first run's NVML file as if it had been killed at PER_FILE_S: no report, rc 124
    tsv = tmp_path / "test_gpu" / "files.tsv"
    tsv.write_text("".join(line.replace("\t0\t", "\t124\t") + "\n" if line.startswith(NVML) else line + "\n"
                           for line in tsv.read_text().splitlines()))
    for xml in (tmp_path / "test_gpu" / "junit").glob("tests_power_test_nvml*.xml"):
        xml.unlink()

    second, doc = _suite(tmp_path, RESUME="1")
    assert second.returncode == 0, second.stdout + second.stderr
    assert _files_run(second) == {NVML}  # the file that passed before is not run again
    assert "1 files passed before and are kept" in second.stdout
    assert doc["kept_from_earlier_run"] == [FEEDBACK] and len(doc["tests"]) == n_tests
    assert {t["outcome"] for t in doc["tests"]} == {"skipped"}  # both files' tests, from both runs' reports

    # NVML failed this time, its report left in place; a resumed run that starts nothing must not read that report
    tsv.write_text("".join(line.replace("\t0\t", "\t1\t") + "\n" if line.startswith(NVML) else line + "\n"
                           for line in tsv.read_text().splitlines()))
    third, doc = _suite(tmp_path, RESUME="1", BUDGET_S="0")
    assert third.returncode == 1 and _files_run(third) == set()
    by_file = {t["test"].split("::")[0]: t["outcome"] for t in doc["tests"]}
    assert by_file == {FEEDBACK: "skipped", NVML: "not_run"}


def test_an_earlier_runs_report_is_not_read_as_this_runs(tmp_path):
    first, doc = _suite(tmp_path)
    assert first.returncode == 0 and {t["outcome"] for t in doc["tests"]} == {"skipped"}
    # a kept file's report must hold every test collected now (the tree may change between two calls): one left out
    # of FEEDBACK's report, as if added since, sends FEEDBACK back to run
    report = next((tmp_path / "test_gpu" / "junit").glob("tests_kernels_test_decode_feedback*.xml"))
    root = ET.parse(report)
    for parent in root.getroot().iter():
        cases = parent.findall("testcase")
        if cases:
            parent.remove(cases[0])
            break
    root.write(report)
    resumed, doc = _suite(tmp_path, RESUME="1")
    assert resumed.returncode == 0 and _files_run(resumed) == {FEEDBACK}, resumed.stdout
    assert doc["kept_from_earlier_run"] == [NVML]
    # a run whose budget starts no file: every test is NOT RUN, though the first run's reports are still there
    again, doc = _suite(tmp_path, BUDGET_S="0")
    assert again.returncode == 1 and _files_run(again) == set()
    assert {t["outcome"] for t in doc["tests"]} == {"not_run"}
