"""dradriver: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""

__version__ = "0.1.0"
DEFAULT_DRIVER_NAME = "gpu.dradriver.io"
