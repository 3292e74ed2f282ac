"""pydsz/gpu/kernels.cu compiles with nvcc under the options pycuda uses, warning-free, and the
quantizer's double arithmetic is not fused: runs wherever nvcc is on PATH, no GPU needed."""

import re
import shutil
import subprocess

import pytest

from pydsz.gpu import _cuda

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def _ptx(tmp_path, arch: str) -> str:
    out = tmp_path / f"kernels_{arch}.ptx"
    subprocess.run([NVCC, f"-arch={arch}", "--ptx", *_cuda.COMPILE_OPTIONS, "-Werror", "all-warnings",
                    str(_cuda.KERNELS), "-o", str(out)], check=True, capture_output=True, text=True)
    return out.read_text()


def _entry(ptx: str, name: str) -> str:
    match = re.search(r"\.entry %s\(.*?\n}\n" % name, ptx, re.S)
    assert match, f"no kernel {name} in the PTX"
    return match.group(0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_warning_free(tmp_path, arch):
    ptx = _ptx(tmp_path, arch)
    for name in ("dsz_quantize_many", "dsz_reconstruct_scatter", "dsz_gemm", "dsz_top1_count", "dsz_activation",
                 "dsz_softmax_xent_grad", "dsz_activation_grad", "dsz_column_sum", "dsz_masked_adam",
                 "dsz_running_mean"):
        _entry(ptx, name)


def test_quantizer_double_arithmetic_is_not_fused(tmp_path):
    ptx = _ptx(tmp_path, "sm_90")
    for name in ("dsz_quantize_many", "dsz_reconstruct_scatter"):
        body = _entry(ptx, name)
        assert "fma.rn.f64" not in body and "mad.f64" not in body, name
        assert "cvt.rzi.s32.f64" in body  # round_half_up's truncation
        assert "cvt.rn.f32.f64" in body  # the reconstruction, rounded once to float


def test_adam_step_is_not_fused(tmp_path):
    assert "fma.rn.f32" not in _entry(_ptx(tmp_path, "sm_90"), "dsz_masked_adam")


def test_gemm_uses_fused_multiply_adds(tmp_path):
    # explicit __fmaf_rn survives -fmad=false: the product runs at full speed
    assert _entry(_ptx(tmp_path, "sm_90"), "dsz_gemm").count("fma.rn.f32") >= 64


def test_kernels_assemble_without_spills(tmp_path):
    result = subprocess.run([NVCC, "-arch=sm_90", "--cubin", *_cuda.COMPILE_OPTIONS, "-Xptxas", "-v",
                             str(_cuda.KERNELS), "-o", str(tmp_path / "kernels.cubin")],
                            check=True, capture_output=True, text=True)
    spills = re.findall(r"(\d+) bytes spill stores", result.stderr)
    assert spills and all(s == "0" for s in spills), result.stderr
