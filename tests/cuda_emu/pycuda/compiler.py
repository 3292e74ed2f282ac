from cuda_emu import SourceModule  # noqa: F401
