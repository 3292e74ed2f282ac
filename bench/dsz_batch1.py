"""`dsz` with every TFLite interpreter run at batch 1: what the CLI would measure once its runtime
stops batching models exported with a fixed batch of 1.

    python bench/dsz_batch1.py compress MODEL --data DIR ...      (same arguments as dsz)

Why: pydsz.runtime._run_batches resizes the input to a batch of 64 and falls back to one sample at a
time only when the interpreter raises. MediaPipe's graphs hard-code batch 1 inside (RESHAPE to
[1, n], STRIDED_SLICE ending at [1, ...]) and do not raise: iris_landmark and
face_detection_short_range then return one row holding every sample's values (so `dsz compress`
sees 1 sample), and hand_recrop returns the right shape with wrong values for samples 1..n-1
(the slice keeps sample 0's features). Running at batch 1 is exact for these models. This wrapper
only changes the batch size passed to the lead's own function; it is a stand-in for the fix, kept
out of /work/main, and the bench reports its rows apart from the plain CLI's.
"""

import sys

from pydsz import runtime

_run_batches = runtime._run_batches


def _one_at_a_time(interpreter, x, batch_size, read):
    return _run_batches(interpreter, x, 1, read)


runtime._run_batches = _one_at_a_time

if __name__ == "__main__":
    from pydsz.cli import main

    sys.exit(main())
