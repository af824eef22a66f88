"""One percentile method in the code base: numpy's, in the benchmark's rows and the grammar pool's."""

from __future__ import annotations

import numpy as np
from specexec.bench.records import percentile


def test_the_benchmark_rows_use_numpys_percentile():
    times = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert percentile([*times, None], 50) == float(np.percentile(times, 50)) == 4.0
    assert percentile([*times, None], 99) == float(np.percentile(times, 99))
    assert percentile([None], 50) is None
