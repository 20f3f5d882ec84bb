"""mlxops: provision a cluster of Apple Silicon Macs and run MLX training on it as one job."""

__version__ = "0.1.0"
