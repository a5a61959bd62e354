"""The model: naming and locating weights (packaged, GGUF, folders, hub ids), converting GGUF
files, loading them, and running a forward pass with early exit."""
