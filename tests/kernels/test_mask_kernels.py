"""Tests for specexec.kernels: the grammar-mask CUDA source (nvcc), the torch path and the CuPy path.

The torch path is checked against a deliberately slow, obvious reference: numpy bit tests on
uint32 words plus ``masked_fill``. The CuPy path (GPU only) is checked against the torch path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from specexec.kernels import (
    apply_mask_inplace,
    apply_mask_inplace_cupy,
    apply_mask_inplace_torch,
)
from specexec.kernels.apply_mask_cupy import KERNEL_NAMES, SOURCE_PATH

NEG_INF = float("-inf")
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DRAFT_VOCAB = 8192

# (logits width, mask vocab or None = 32 * words, words): awkward sizes around real vocabularies.
VOCAB_CASES = {
    "49152": (49152, None, 1536),
    "padded-logits": (128010, 128001, 4001),  # columns 128001.. are padding -> -inf
    "padded-logits-default": (128010, None, 4001),  # bits 128001..128009 of the mask are read
    "short-mask": (128010, None, 4000),  # mask covers 128000 tokens: the last 10 columns -> -inf
    "long-mask": (128001, 128010, 4001),  # bits past the logits width are ignored
}


# --------------------------------------------------------------------------- helpers


def random_bitmask(rows: int, words: int, seed: int) -> torch.Tensor:
    """Random int32 words, with the awkward values (0, -1, INT_MIN, 1) planted at the start."""
    rng = np.random.default_rng(seed)
    mask = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    special = np.array([0, -1, -(2**31), 1, 2**31 - 1], dtype=np.int32)
    mask[:, : len(special)] = special[: min(words, len(special))]
    return torch.from_numpy(mask)


def random_logits(
    rows: int, vocab: int, dtype: torch.dtype, layout: str, seed: int, device: str = "cpu"
) -> torch.Tensor:
    """[rows, vocab] logits: contiguous, a column slice of a wider tensor, or every other row."""
    gen = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        return torch.randn(rows, vocab, generator=gen).to(device=device, dtype=dtype)
    if layout == "column-slice":
        base = torch.randn(rows, vocab + 37, generator=gen).to(device=device, dtype=dtype)
        view = base[:, 5 : 5 + vocab]
    elif layout == "every-other-row":
        base = torch.randn(2 * rows, vocab, generator=gen).to(device=device, dtype=dtype)
        view = base[::2]
    else:
        raise AssertionError(layout)
    assert view.stride(0) != vocab and view.stride(1) == 1
    return view


def seed_of(*parts: object) -> int:
    """A per-test seed that is stable across runs (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def random_d2t(target_vocab: int, seed: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """EAGLE-3 style offsets: draft id i -> target id i + d2t[i], sorted targets, plus edge cases."""
    rng = np.random.default_rng(seed)
    targets = np.sort(rng.choice(target_vocab, size=DRAFT_VOCAB, replace=False)).astype(np.int64)
    targets[0] = 0
    targets[-1] = target_vocab - 1
    d2t = targets - np.arange(DRAFT_VOCAB, dtype=np.int64)
    return torch.from_numpy(d2t).to(dtype)


def slow_reference(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    needs_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
    mask_vocab: int | None,
) -> torch.Tensor:
    """The obvious implementation: per row, numpy bit tests on uint32 words, then masked_fill."""
    words = bitmask.numpy().view(np.uint32)
    if mask_vocab is None:
        mask_vocab = 32 * words.shape[1]
    vocab = logits.shape[1]
    columns = np.arange(vocab, dtype=np.int64)
    tokens = columns if d2t is None else columns + d2t.numpy().astype(np.int64)
    in_range = (tokens >= 0) & (tokens < mask_vocab)
    safe = np.where(in_range, tokens, 0)
    out = logits.clone()
    for row in range(logits.shape[0]):
        if needs_mask is not None and not bool(needs_mask[row]):
            continue
        bit = (words[row, safe // 32] >> (safe % 32).astype(np.uint32)) & np.uint32(1)
        allowed = in_range & (bit == 1)
        out[row].masked_fill_(torch.from_numpy(~allowed), NEG_INF)
    return out


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    int_dtype = INT_VIEW[actual.dtype]
    a, e = actual.view(int_dtype), expected.view(int_dtype)
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        raise AssertionError(f"{bad.shape[0]} entries differ, first at {bad[:5].tolist()}")


def needs_mask_for(rows: int, kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "some-zero":
        return torch.tensor([1, 0, 1, 0][:rows], dtype=torch.int32)
    if kind == "all-zero":
        return torch.zeros(rows, dtype=torch.int32)
    raise AssertionError(kind)


# --------------------------------------------------------------------------- (a) nvcc


def _compile_ptx(arch: str, tmp_path: Path) -> str:
    ptx = tmp_path / f"apply_mask_{arch}.ptx"
    cmd = [
        "nvcc",
        "-std=c++17",
        "-ptx",
        f"-arch={arch}",
        "-DSPECEXEC_NVCC_CHECK",
        "-o",
        str(ptx),
        str(SOURCE_PATH),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"nvcc failed:\n{result.stdout}\n{result.stderr}"
    assert "warning" not in result.stderr.lower(), result.stderr
    return ptx.read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles_with_nvcc(arch: str, tmp_path: Path) -> None:
    ptx = _compile_ptx(arch, tmp_path)
    assert f".target {arch}" in ptx
    entries = re.findall(r"\.entry\s+(\S+?)\(", ptx)
    assert len(entries) == 3, entries
    # Itanium mangling of apply_mask_kernel<float / __half / __nv_bfloat16>.
    for mangled in (
        "apply_mask_kernelIfE",
        "apply_mask_kernelI6__halfE",
        "apply_mask_kernelI13__nv_bfloat16E",
    ):
        assert sum(mangled in name for name in entries) == 1, (mangled, entries)


def test_kernel_names_match_the_source() -> None:
    source = SOURCE_PATH.read_text()
    assert "template <typename T>\n__global__ void __launch_bounds__(256) apply_mask_kernel(" in source
    assert set(KERNEL_NAMES.values()) == {
        "apply_mask_kernel<float>",
        "apply_mask_kernel<__half>",
        "apply_mask_kernel<__nv_bfloat16>",
    }
    assert "#include <torch" not in source


# --------------------------------------------------------------------------- (b) torch path


@pytest.mark.parametrize("case", list(VOCAB_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "column-slice", "every-other-row"])
@pytest.mark.parametrize("needs", ["none", "some-zero"])
def test_torch_path_matches_slow_reference(case: str, dtype: torch.dtype, layout: str, needs: str) -> None:
    vocab, mask_vocab, words = VOCAB_CASES[case]
    rows = 4 if needs == "some-zero" else 2
    seed = seed_of(case, dtype, layout, needs)
    logits = random_logits(rows, vocab, dtype, layout, seed)
    bitmask = random_bitmask(rows, words, seed + 1)
    needs_mask = needs_mask_for(rows, needs)
    expected = slow_reference(logits, bitmask, needs_mask, None, mask_vocab)
    before = logits.clone()

    apply_mask_inplace_torch(logits, bitmask, needs_mask, mask_vocab=mask_vocab)

    assert_bitwise_equal(logits, expected)
    if needs_mask is not None:
        for row in (needs_mask == 0).nonzero().flatten().tolist():
            assert_bitwise_equal(logits[row], before[row])
    assert torch.isneginf(logits[0]).any() and not torch.isneginf(logits[0]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "column-slice", "every-other-row"])
@pytest.mark.parametrize("needs", ["none", "some-zero"])
@pytest.mark.parametrize("d2t_dtype", [torch.int64, torch.int32], ids=str)
def test_torch_path_with_d2t_matches_slow_reference(
    dtype: torch.dtype, layout: str, needs: str, d2t_dtype: torch.dtype
) -> None:
    target_vocab, words = 128001, 4001  # padded target: 4001 words hold 128032 bits
    rows = 4 if needs == "some-zero" else 3
    seed = seed_of("d2t", dtype, layout, needs, d2t_dtype)
    logits = random_logits(rows, DRAFT_VOCAB, dtype, layout, seed)
    bitmask = random_bitmask(rows, words, seed + 1)
    d2t = random_d2t(target_vocab, seed + 2, d2t_dtype)
    needs_mask = needs_mask_for(rows, needs)
    expected = slow_reference(logits, bitmask, needs_mask, d2t, target_vocab)
    before = logits.clone()

    apply_mask_inplace_torch(logits, bitmask, needs_mask, d2t, mask_vocab=target_vocab)

    assert_bitwise_equal(logits, expected)
    if needs_mask is not None:
        for row in (needs_mask == 0).nonzero().flatten().tolist():
            assert_bitwise_equal(logits[row], before[row])


def test_d2t_targets_outside_the_mask_vocab_are_disallowed() -> None:
    bitmask = torch.full((1, 4), -1, dtype=torch.int32)  # 128 bits, all allowed
    d2t = torch.tensor([0, 99, -5, 120], dtype=torch.int64)  # targets 0, 100, -3, 123
    logits = torch.zeros(1, 4)
    apply_mask_inplace_torch(logits, bitmask, d2t=d2t, mask_vocab=110)
    assert logits.tolist() == [[0.0, 0.0, NEG_INF, NEG_INF]]


def test_bit_order_matches_xgrammar() -> None:
    """Bit j of word j // 32 is token j; bit 31 is the sign bit of the int32 word."""
    bitmask = torch.tensor([[(1 << 3) | (1 << 30), -(2**31), 0]], dtype=torch.int32)
    logits = torch.zeros(1, 70)
    apply_mask_inplace_torch(logits, bitmask)
    allowed = (~torch.isneginf(logits[0])).nonzero().flatten().tolist()
    assert allowed == [3, 30, 63]


def test_all_rows_skipped_and_empty_inputs_are_noops() -> None:
    logits = torch.randn(3, 100)
    before = logits.clone()
    bitmask = torch.zeros(3, 4, dtype=torch.int32)
    apply_mask_inplace_torch(logits, bitmask, torch.zeros(3, dtype=torch.int32))
    apply_mask_inplace_torch(logits, bitmask, torch.zeros(3, dtype=torch.bool))
    assert_bitwise_equal(logits, before)
    apply_mask_inplace_torch(torch.empty(0, 100), torch.empty(0, 4, dtype=torch.int32))


def test_bool_needs_mask_and_nan_logits() -> None:
    logits = torch.tensor([[float("nan"), 1.0, float("nan"), -0.0]] * 2)
    bitmask = torch.tensor([[0b1010]] * 2, dtype=torch.int32)
    apply_mask_inplace_torch(logits, bitmask, torch.tensor([True, False]))
    assert torch.isneginf(logits[0, [0, 2]]).all()  # disallowed NaN -> -inf, as masked_fill
    assert logits[0, 1].item() == 1.0 and str(logits[0, 3].item()) == "-0.0"  # allowed: untouched
    assert torch.isnan(logits[1, [0, 2]]).all()


def test_dispatch_auto_on_cpu_uses_torch_path() -> None:
    logits = random_logits(2, 4000, torch.float16, "column-slice", 7)
    bitmask = random_bitmask(2, 125, 8)
    expected = slow_reference(logits, bitmask, None, None, None)
    apply_mask_inplace(logits, bitmask)
    assert_bitwise_equal(logits, expected)
    logits2 = random_logits(2, 4000, torch.float16, "column-slice", 7)
    apply_mask_inplace(logits2, bitmask, backend="torch")
    assert_bitwise_equal(logits2, expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logits": torch.zeros(64)}, "2-D"),
        ({"logits": torch.zeros(2, 64, dtype=torch.int32)}, "dtype"),
        ({"bitmask": torch.zeros(2, 2, dtype=torch.int64)}, "int32"),
        ({"bitmask": torch.zeros(3, 2, dtype=torch.int32)}, "rows"),
        ({"needs_mask": torch.ones(3, dtype=torch.int32)}, "needs_mask"),
        ({"needs_mask": torch.ones(2, dtype=torch.float32)}, "needs_mask"),
        ({"d2t": torch.zeros(63, dtype=torch.int64)}, "d2t"),
        ({"d2t": torch.zeros(64, dtype=torch.float32)}, "d2t"),
        ({"mask_vocab": 65}, "mask_vocab"),
        ({"mask_vocab": -1}, "mask_vocab"),
        ({"backend": "triton"}, "backend"),
        ({"backend": "cupy"}, "CUDA"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    args = {"logits": torch.zeros(2, 64), "bitmask": torch.zeros(2, 2, dtype=torch.int32)} | kwargs
    with pytest.raises(ValueError, match=message):
        apply_mask_inplace(**args)


def test_cupy_backend_rejects_cpu_tensors_without_importing_cupy() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        apply_mask_inplace_cupy(torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32))


# --------------------------------------------------------------------------- (c) CuPy path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "column-slice", "every-other-row"])
@pytest.mark.parametrize("needs", ["none", "some-zero"])
@pytest.mark.parametrize("case", ["49152", "padded-logits", "short-mask", "long-mask", "d2t"])
def test_cupy_path_matches_torch_path(dtype: torch.dtype, layout: str, needs: str, case: str) -> None:
    pytest.importorskip("cupy", reason="the CuPy path needs the optional 'cuda' extra (cupy)")
    rows = 4
    seed = seed_of("cupy", dtype, layout, needs, case)
    if case == "d2t":
        vocab, mask_vocab, words = DRAFT_VOCAB, 128001, 4001
        d2t = random_d2t(mask_vocab, seed + 2).cuda()
    else:
        vocab, mask_vocab, words = VOCAB_CASES[case]
        d2t = None
    logits = random_logits(rows, vocab, dtype, layout, seed, device="cuda")
    bitmask = random_bitmask(rows, words, seed + 1).cuda()
    needs_mask = needs_mask_for(rows, needs)
    needs_mask = None if needs_mask is None else needs_mask.cuda()

    expected = logits.clone()
    apply_mask_inplace_torch(expected, bitmask, needs_mask, d2t, mask_vocab=mask_vocab)
    before = logits.clone()
    apply_mask_inplace(logits, bitmask, needs_mask, d2t, backend="cupy", mask_vocab=mask_vocab)
    torch.cuda.synchronize()

    assert_bitwise_equal(logits.cpu(), expected.cpu())
    if needs_mask is not None:
        for row in (needs_mask == 0).nonzero().flatten().tolist():
            assert_bitwise_equal(logits[row].cpu(), before[row].cpu())
    # auto picks the CuPy kernel on CUDA when cupy imports
    auto = before.clone()
    apply_mask_inplace(auto, bitmask, needs_mask, d2t, mask_vocab=mask_vocab)
    assert_bitwise_equal(auto.cpu(), expected.cpu())
