"""Model intake (GGUF, Hugging Face directories, shape presets) and edgekit's decoder."""
