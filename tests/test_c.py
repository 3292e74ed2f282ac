"""libdsz's C unit tests, built and run through their Makefile (skipped without a C compiler)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

LIBDSZ = pathlib.Path(__file__).resolve().parent.parent / "libdsz"
TESTS = LIBDSZ / "tests"
needs_cc = pytest.mark.skipif(not (shutil.which("make") and (shutil.which("cc") or shutil.which("gcc"))),
                              reason="no C compiler or make")


def run_make(target):
    r = subprocess.run(["make", "-C", str(TESTS), target], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "libdsz tests passed" in r.stdout


@needs_cc
def test_c_unit_tests():
    run_make("test")


@needs_cc
@pytest.mark.slow
def test_c_unit_tests_under_asan_ubsan():
    probe = subprocess.run(["cc", "-fsanitize=address,undefined", "-x", "c", "-o", "/dev/null", "-"],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the C compiler cannot build with sanitizers here")
    run_make("sanitize")


@needs_cc
@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("nm"), reason="needs ELF and nm")
def test_shared_library_exports_only_dsz_h_and_runs_the_example():
    r = subprocess.run(["make", "-s", "-C", str(LIBDSZ), "check"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "exactly dsz.h's" in r.stdout
    assert "largest error" in r.stdout


def test_readme_example_is_the_one_make_check_runs():
    example = (LIBDSZ / "examples" / "roundtrip.c").read_text()
    assert example[example.index("#include <math.h>"):] in (LIBDSZ / "README.md").read_text()
