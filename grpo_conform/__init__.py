"""grpo-conform: conformance checks, honest timing and signed evidence for GRPO loss kernels."""

__version__ = "0.1.0"
