"""CompiledKernel <-> JSON bytes, for the build's on-disk compile cache.

The JSON holds the metadata and the binaries (cubin base64, PTX text). It is
only ever read back from the local cache of the machine that wrote it, never
from the network.
"""

from __future__ import annotations

import base64
import json

from edgekit.kernels.aot import CompiledKernel
from edgekit.kernels.variants import KernelVariant


def compiled_to_json(ck: CompiledKernel) -> bytes:
    return json.dumps(ck.to_json_dict(), sort_keys=True).encode()


def compiled_from_json(data: bytes) -> CompiledKernel:
    d = json.loads(data)
    return CompiledKernel(
        name=d["name"], shared_bytes=d["shared_bytes"], num_warps=d["num_warps"], num_stages=d["num_stages"],
        cubin=base64.b64decode(d["cubin_b64"]), ptx=d["ptx"], arch=d["arch"], triton_version=d["triton_version"],
        hidden_args=d["hidden_args"], global_scratch_size=d["global_scratch_size"], registers=d["registers"],
        spills=d["spills"], signature=[tuple(p) for p in d["signature"]], precision=d["precision"],
        launch_rule=d["launch_rule"], variant=KernelVariant.from_dict(d["variant"]), ptx_version=d["ptx_version"],
        global_scratch_align=d["global_scratch_align"],
    )
