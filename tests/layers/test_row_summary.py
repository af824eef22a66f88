"""The C++ row summary (each logit row's status and argmax, `executor/layers/row_summary.py`) against
torch's max, on the rows verification meets: ties, NaN, +inf, every entry -inf, a max in the tail past
the last full vector, odd vocab sizes, rows that are views."""

from __future__ import annotations

import pytest
import torch
from specexec.executor.layers.cpu_kernels import cpu_kernels
from specexec.executor.layers.row_summary import row_summary
from specexec.sampling.params import SamplingParams
from specexec.sampling.rejection import RejectionSampler, Verification
from specexec.sampling.rejection import row_summary as torch_row_summary
from specexec.sampling.spec_decode_metadata import SpecDecodeMetadata

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def awkward_rows(vocab: int, dtype: torch.dtype) -> torch.Tensor:  # [rows, vocab]
    gen = torch.Generator().manual_seed(vocab)
    rows = torch.randn(10, vocab, generator=gen).to(dtype)
    last = vocab - 1
    rows[1, last] = 50.0  # the max in the tail
    rows[2, min(3, last)] = rows[2, last] = 60.0  # a tie: the first index wins
    rows[3, last // 2] = float("nan")  # NaN: status 1, the first NaN
    rows[3, last] = float("nan")
    rows[4, last] = float("inf")  # +inf: status 2
    rows[5] = float("-inf")  # every entry -inf: status 3, index 0
    rows[6] = float("-inf")
    rows[6, last] = -3.0  # one finite entry among -inf
    rows[7] = 0.0  # all equal
    rows[8, 0] = float("nan")  # NaN first, then +inf
    rows[8, last] = float("inf")
    rows[9] = -0.0
    rows[9, last] = 0.0  # -0 and 0 tie: the first index
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 16, 33, 49_157])
def test_the_op_gives_torchs_status_and_argmax(dtype, vocab):
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernels did not build here (see the log); this machine has a compiler")
    rows = awkward_rows(vocab, dtype)
    assert torch.equal(cpu_kernels().row_status_argmax(rows), torch_row_summary(rows))
    assert torch.equal(row_summary(rows), torch_row_summary(rows))


def test_rows_that_are_views_and_float64_rows():
    if cpu_kernels() is None:
        pytest.fail("the C++ CPU kernels did not build here (see the log); this machine has a compiler")
    wide = awkward_rows(70, torch.bfloat16)
    view = wide[::2, 3:60]  # rows 2 apart, a slice of each
    assert torch.equal(cpu_kernels().row_status_argmax(view), torch_row_summary(view))
    exact = awkward_rows(70, torch.float64)  # float64 stays on torch's max (the tests' reference dtype)
    assert torch.equal(row_summary(exact), torch_row_summary(exact))
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        cpu_kernels().row_status_argmax(exact)


@pytest.mark.parametrize("dtype", DTYPES)
def test_verification_through_the_op_is_verification_through_torch(dtype):
    """The engine's sampler takes the op: greedy verdicts over drafts, unreadable rows among them."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 40, generator=gen).to(dtype)  # 3 requests: 2 drafts, none, 4 drafts
    argmax = logits.float().argmax(dim=-1).tolist()
    logits[7, 5] = float("nan")  # request 2's row 3: its third draft cannot be checked
    drafts = [[argmax[0], (argmax[1] + 1) % 40], [], [argmax[4], argmax[5], argmax[6], argmax[7]]]
    meta = SpecDecodeMetadata.build(drafts, None, 40)
    params = [SamplingParams(temperature=0.0)] * 3
    want = RejectionSampler().verify_batch(logits, meta, params, [None] * 3)
    got = RejectionSampler(row_summary).verify_batch(logits, meta, params, [None] * 3)
    assert got == want
    assert want[0] == Verification([argmax[0], argmax[1]], 1)


AVX2_CHECK = """
import sys, torch
from torch.utils.cpp_extension import load
build, source, inputs, out = sys.argv[1:5]
load(name="row_summary_avx2", sources=[source], extra_cflags=["-O2", "-march=x86-64-v3"],
     build_directory=build, is_python_module=False, verbose=False)
torch.save([torch.ops.specexec_cpu.row_status_argmax(rows) for rows in torch.load(inputs)], out)
"""


@pytest.mark.slow
def test_the_avx2_build_gives_torchs_answers(tmp_path):
    """The AVX2 vector path (8 lanes, its own NaN and first-index masks), built apart: this CPU may run
    the AVX-512 one."""
    import subprocess
    import sys
    from pathlib import Path

    from specexec.executor.layers import row_summary as module

    if not (sys.platform == "linux" and " avx2" in Path("/proc/cpuinfo").read_text()):
        pytest.fail("this check builds x86-64 code: it needs an x86-64 Linux machine with AVX2, as CI has")
    inputs = [awkward_rows(vocab, dtype) for dtype in DTYPES for vocab in (7, 33, 1000)]
    torch.save(inputs, tmp_path / "inputs.pt")
    (tmp_path / "check.py").write_text(AVX2_CHECK)
    (tmp_path / "build").mkdir()
    source = Path(module.__file__).with_name("row_summary_cpu.cpp")
    command = [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "build"), str(source)]
    subprocess.run([*command, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")], check=True, timeout=600)
    for got, rows in zip(torch.load(tmp_path / "out.pt"), inputs):
        assert torch.equal(got, torch_row_summary(rows)), (rows.dtype, rows.shape)
