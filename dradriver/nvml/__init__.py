"""The NVML edge: the only place that touches the GPU driver."""
