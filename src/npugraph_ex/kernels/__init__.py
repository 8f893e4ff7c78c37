"""Kernels compiled for captured shapes (``static_kernel_compile``), between passes and capture."""
