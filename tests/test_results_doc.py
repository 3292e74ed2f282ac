"""The documents that quote measurements say what bench/results/*.json say, and bench/README.md indexes
every benchmark script. Nothing here runs a benchmark: bench/results.py only reads JSON files."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _results_module():
    spec = importlib.util.spec_from_file_location("bench_results", BENCH / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_what_the_json_files_give():
    results = _results_module()
    assert (ROOT / "doc" / "results.md").read_text() == results.render(), \
        "doc/results.md is out of date: run python3 bench/results.py"


def test_readme_results_are_what_the_json_files_give():
    results = _results_module()
    readme = (ROOT / "README.md").read_text()
    assert readme == results.readme_with_table(readme), "README.md's results are out of date: run python3 bench/results.py"


def test_the_nonclassifier_results_are_what_the_json_gives():
    results = _results_module()
    text = (BENCH / "MODELS-nonclassifier.md").read_text()
    assert text == results.models_nonclassifier_with_table(text), \
        "bench/MODELS-nonclassifier.md's results are out of date: run python3 bench/results.py"


def test_results_md_is_deterministic():
    results = _results_module()
    assert results.render() == results.render()


def test_bench_readme_indexes_every_script():
    index = (BENCH / "README.md").read_text()
    scripts = [p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*") if p.suffix in (".py", ".sh")
               and "results" not in p.relative_to(BENCH).parts[:-1] and "__pycache__" not in p.parts]
    assert scripts
    missing = [s for s in scripts if f"`{s}`" not in index]
    assert not missing, f"bench/README.md does not index {missing}"


def test_bench_readme_names_only_scripts_that_exist():
    index = (BENCH / "README.md").read_text()
    named = set(re.findall(r"^\| `([\w/]+\.(?:py|sh))` \|", index, re.MULTILINE))
    assert named
    assert not [s for s in named if not (BENCH / s).exists()]


def test_readme_keeps_the_two_commands_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    assert "apt-get update && apt-get install -y gcc python3-dev dataset-fashion-mnist && pip install -e \".[server]\" && dsz demo" in readme
    assert "bash .ci/run" in readme
    assert len(readme.splitlines()) <= 200
