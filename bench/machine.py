"""What a benchmark ran on, for its JSON record (shared by the scripts in bench/)."""
import datetime
import os
import platform
import subprocess
from pathlib import Path

import numpy as np


def machine_info(**versions) -> dict:
    """CPU, cores, platform, Python and numpy, the date, and the given package versions."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, **versions,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def commit(dirty_paths: tuple = ()) -> str:
    """The checkout's HEAD (short), marked where the files under dirty_paths differ from it: what a run measured."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                              text=True).stdout.strip()

    dirty = dirty_paths and git("status", "--porcelain", "--", *dirty_paths)
    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if dirty else "")
