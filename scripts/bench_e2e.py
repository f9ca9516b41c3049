#!/usr/bin/env python3
"""End-to-end benchmark on the GPU machine: the same code as `edgekit bench` (pass its options).

    python scripts/bench_e2e.py --json $OUT/bench.json
    python scripts/bench_e2e.py preset:qwen2.5-1.5b --precision fp16,int8 --baselines compile --json $OUT/qwen.json
"""

import sys

from edgekit.cli import main

if __name__ == "__main__":
    sys.argv = ["edgekit", "bench", *sys.argv[1:]]
    main()
