"""The seeds edgekit takes, from the CLI's --seed and from serve's "seed" field alike."""

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit value; a larger one is an OverflowError
