"""End-to-end benchmarks: edgekit's runtime against the baselines a user would pick instead.

Map of the package:

- ``hf_twin``: the same model as a transformers ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``
  (packed ``wqkv`` / ``w_gate_up`` split back into q/k/v and gate/up), so every baseline runs
  the very weights edgekit runs.
- ``roofline``: bytes one decoded token must read (weights at their precision + the KV cache)
  and the tokens/s that a measured copy bandwidth allows. Pure arithmetic.
- ``measure``: timers (CUDA events on a GPU), the device-copy bandwidth, the NVML energy meter.
- ``engines``: the contenders behind one interface: edgekit's runtime (Triton table + CUDA-graph
  replay), edgekit's reference model under ``torch.compile(mode="reduce-overhead")``,
  transformers' eager ``generate`` and transformers' static cache + compile.
- ``stepped``: one stepped engine measured: prompt, the reference path's tokens, timed prefill and
  decode loop, token check, roofline.
- ``runner``: runs every (model, precision, engine, context), checks the greedy tokens against
  the reference path, and assembles the JSON document (rows, ratios, goals).
- ``sm_partition``, ``sm_probe``, ``partition_run``: ``--sms``: the fused decode confined to N SMs
  by a CUDA green context (an Orin's SM count), against the copy bandwidth of the same partition,
  with the orin plan's tiles and alternatives.
- ``report``: the rich tables.

Every number it produces is measured in one process and run; the JSON says on which device.
"""
