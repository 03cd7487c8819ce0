"""memprobe: memory profiling and regression gates for LLM log-probability kernels."""

__version__ = "0.1.0"
