"""Where a figure came from, in one vocabulary for every command, report and log (DESIGN.md, decision 11).

The ``measured_on`` values edgekit writes (JSON, logs, reports):

``cpu``                               measured on this machine's CPU (edgekit's reference operators run there)
``gpu (NVIDIA H100 80GB HBM3)``       measured on this machine's GPU, named as CUDA names it
``predicted for orin (roofline ...)`` not measured: the roofline model's figure for a target profile

A value starts with ``cpu``, ``gpu`` or ``predicted``; scripts can test that word. ``in_words`` says it in a sentence
for terminal output.
"""

from __future__ import annotations

CPU = "cpu"
GPU = "gpu"
PREDICTED = "predicted"


def measured_on(device) -> str:
    """The ``measured_on`` value of a figure measured on ``device`` (a torch.device, or a name such as "cuda:0")."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{GPU} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return CPU
    return device.type  # another torch device: named by its type, never passed off as a CPU or a GPU


def predicted_for(target: str) -> str:
    """The ``measured_on``/label value of a figure the roofline model predicts for the target profile ``target``."""
    return f"{PREDICTED} for {target} (roofline model; not measured)"


def in_words(value: str) -> str:
    """A ``measured_on`` value as terminal text: 'measured on the CPU', 'measured on the GPU (NVIDIA H100 ...)', or a
    prediction as it is."""
    if value == CPU:
        return "measured on the CPU"
    if value.startswith(GPU + " ") or value == GPU:
        return "measured on the GPU" + value[len(GPU):]
    if value.startswith(PREDICTED):
        return value
    return f"measured on {value}"
