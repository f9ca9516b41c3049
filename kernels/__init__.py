"""edgekit.kernels: one module per operator (spec + torch reference + Triton kernel) and the dispatch table."""
