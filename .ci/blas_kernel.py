"""Print an OpenBLAS kernel name other than the one numpy's OpenBLAS picks on this machine.

    OPENBLAS_CORETYPE=$(python .ci/blas_kernel.py) python -m pytest ...

OpenBLAS chooses its sgemm kernel at run time from the CPU; kernels associate sums differently, so a
test that holds bit-identity across shapes handed to the BLAS passes on one machine and fails on
another (issue 39). .ci/run runs the tests again under the kernel this prints, so that such a test
fails here rather than on a user's machine. Only kernels this CPU can execute are chosen: Haswell
needs AVX2 and FMA, Sandybridge AVX, Prescott nothing beyond x86-64's SSE3.
"""
import numpy  # noqa: F401  (loads the OpenBLAS that threadpoolctl inspects)
import threadpoolctl


def picked() -> str:
    for info in threadpoolctl.threadpool_info():
        if info.get("internal_api") == "openblas":
            return str(info.get("architecture") or "")
    return ""


def flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def other(current: str, cpu: set) -> str:
    """Haswell where another kernel is picked and the CPU runs it; else the next older kernel ("" where
    there is none: a CPU that runs only the kernel picked)."""
    candidates = [name for name, needs in (("Haswell", {"avx2", "fma"}), ("Sandybridge", {"avx"}), ("Prescott", set()))
                  if needs <= cpu]
    return next((name for name in candidates if name.lower() != current.lower()), "")


if __name__ == "__main__":
    print(other(picked(), flags()))
