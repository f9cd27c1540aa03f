"""DP-SGD: the optimiser loop, clipping strategies and per-example gradient samplers."""
