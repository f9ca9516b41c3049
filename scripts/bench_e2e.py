#!/usr/bin/env python3
"""End-to-end benchmark on the GPU machine: the same code as `edgekit bench` (pass its options).

On the GPU machine (tools/gpu_setup.sh makes edgekit importable; run outside the repo):

    source tools/gpu_setup.sh && cd $EDGEKIT_RUN_DIR && python3 $R/scripts/bench_e2e.py --json $OUT/bench.json
    (same as: python3 -m edgekit bench --json $OUT/bench.json)
"""

import sys

from edgekit.cli import main

if __name__ == "__main__":
    sys.argv = ["edgekit", "bench", *sys.argv[1:]]
    main()
