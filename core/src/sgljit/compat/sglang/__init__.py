"""sglang.jit_kernel's call sites."""
