from cuda_emu import CompileError, Device, Error, LaunchError, LogicError, init  # noqa: F401
