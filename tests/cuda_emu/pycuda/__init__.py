"""A stand-in for the parts of pycuda that pydsz uses, running kernels on the CPU (tests/cuda_emu/README.md).

Put tests/cuda_emu first on PYTHONPATH and `import pycuda` finds this package instead of the real one.
"""
