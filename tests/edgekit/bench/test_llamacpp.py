"""Reading llama-bench's JSON (records as llama.cpp printed them on the GPU machine, trimmed to the fields read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekit.bench.llamacpp import llama_bench_command, parse_llama_bench
from edgekit.errors import BenchmarkError

RECORDS = [
    {"build_commit": "unknown", "gpu_info": "NVIDIA H200", "model_filename": "smollm2-135m-f16.gguf", "n_prompt": 512,
     "n_gen": 0, "n_depth": 512, "avg_ts": 64506.4, "stddev_ts": 21807.1},
    {"build_commit": "unknown", "gpu_info": "NVIDIA H200", "model_filename": "smollm2-135m-f16.gguf", "n_prompt": 0,
     "n_gen": 128, "n_depth": 512, "avg_ts": 917.778053, "stddev_ts": 43.035343},
]


def test_prefill_and_decode_records_are_told_apart():
    rows = parse_llama_bench("ggml_cuda_init: found 1 CUDA devices\n" + json.dumps(RECORDS))
    assert [(r["test"], r["tokens"], r["depth"]) for r in rows] == [("pp", 512, 512), ("tg", 128, 512)]
    assert rows[1]["tokens_per_s"] == pytest.approx(917.778053) and rows[1]["model"] == "smollm2-135m-f16.gguf"


def test_output_without_json_is_a_clear_error():
    with pytest.raises(BenchmarkError, match="no JSON list"):
        parse_llama_bench("error: failed to load model")


def test_the_command_runs_every_file_at_one_depth():
    cmd = llama_bench_command(Path("/x/llama-bench"), [Path("a.gguf"), Path("b.gguf")], 512, 128, 512, 3)
    assert cmd[:3] == ["/x/llama-bench", "-m", "a.gguf,b.gguf"]
    assert cmd[cmd.index("-d") + 1] == "512" and cmd[cmd.index("-fa") + 1] == "1" and cmd[-2:] == ["-o", "json"]
