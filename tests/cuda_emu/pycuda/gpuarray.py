from cuda_emu import GPUArray, empty, to_gpu, zeros  # noqa: F401
