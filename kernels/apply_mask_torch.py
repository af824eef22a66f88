"""Grammar-mask application in plain torch: the reference implementation and the CPU path.

Semantics (shared by every backend, see `apply_mask_inplace_torch`):

* ``logits`` ``[num_rows, vocab]`` float32 / float16 / bfloat16, any strides (a column slice
  or an every-other-row view of a bigger tensor is fine);
* ``bitmask`` ``[num_rows, words]`` int32, xgrammar's packing: token ``t`` is allowed iff
  ``(bitmask[r, t // 32] >> (t % 32)) & 1``;
* ``needs_mask`` ``[num_rows]`` int32 (or bool): rows with 0 are left untouched;
* ``d2t`` ``[vocab]`` int64 / int32: draft column ``i`` stands for target token ``i + d2t[i]``
  (EAGLE-3), so draft logits are masked by the target's bitmask;
* ``mask_vocab`` (keyword, default ``32 * words``): tokens at or past it are disallowed, which
  sets padding columns of a padded vocabulary to -inf; bits past the logits width are ignored.

Disallowed entries become -inf. The update is branch-free: logits are viewed as same-width
integers and -inf's bit pattern is selected in with a per-element all-ones/all-zeros mask,
``x ^= (x ^ NEG_INF) & m``. ``masked_fill_`` does the same job but branches per element and a
grammar mask's bits are unpredictable enough to make it several times slower on CPU.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["apply_mask_inplace_torch", "check_mask_args"]

#: Logits dtypes -> (same-width integer dtype, bit pattern of -inf in it).
_INT_VIEW: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, -0x00800000),  # 0xff800000
    torch.float16: (torch.int16, -0x0400),  # 0xfc00
    torch.bfloat16: (torch.int16, -0x0080),  # 0xff80
    torch.float64: (torch.int64, -0x0010000000000000),  # 0xfff0000000000000 (CPU tests, exact models)
}
_D2T_DTYPES = (torch.int64, torch.int32)
_NEEDS_DTYPES = (torch.int32, torch.bool)


def check_mask_args(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    needs_mask: torch.Tensor | None,
    d2t: torch.Tensor | None,
    mask_vocab: int | None,
) -> int:
    """Validate the arguments of the apply-mask functions; returns the effective mask vocab.

    Raises ValueError (never asserts) on a bad shape, dtype, device or mask vocab.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(bitmask, torch.Tensor):
        raise ValueError("logits and bitmask must be torch tensors")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_rows, vocab], got shape {tuple(logits.shape)}")
    if logits.dtype not in _INT_VIEW:
        raise ValueError(f"logits dtype must be float32, float16, bfloat16 or float64, got {logits.dtype}")
    if bitmask.dim() != 2:
        raise ValueError(f"bitmask must be 2-D [num_rows, words], got shape {tuple(bitmask.shape)}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask dtype must be int32, got {bitmask.dtype}")
    num_rows, vocab = logits.shape
    if bitmask.shape[0] != num_rows:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits have {num_rows}")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device}, logits on {logits.device}")
    if vocab >= 2**31 or bitmask.shape[1] * 32 >= 2**31:
        raise ValueError("vocabularies of 2**31 tokens or more are not supported")
    mask_bits = bitmask.shape[1] * 32
    if mask_vocab is None:
        mask_vocab = mask_bits
    elif isinstance(mask_vocab, bool) or not isinstance(mask_vocab, int):
        raise ValueError(f"mask_vocab must be an int, got {type(mask_vocab).__name__}")
    elif not 0 <= mask_vocab <= mask_bits:
        raise ValueError(
            f"mask_vocab={mask_vocab} does not fit the bitmask: {bitmask.shape[1]} words hold "
            f"{mask_bits} tokens"
        )
    if needs_mask is not None:
        if not isinstance(needs_mask, torch.Tensor) or needs_mask.dim() != 1:
            raise ValueError("needs_mask must be a 1-D tensor [num_rows]")
        if needs_mask.shape[0] != num_rows:
            raise ValueError(f"needs_mask has {needs_mask.shape[0]} entries, logits have {num_rows} rows")
        if needs_mask.dtype not in _NEEDS_DTYPES:
            raise ValueError(f"needs_mask dtype must be int32 (or bool), got {needs_mask.dtype}")
        if needs_mask.device != logits.device:
            raise ValueError(f"needs_mask is on {needs_mask.device}, logits on {logits.device}")
    if d2t is not None:
        if not isinstance(d2t, torch.Tensor) or d2t.dim() != 1:
            raise ValueError("d2t must be a 1-D tensor [draft_vocab]")
        if d2t.shape[0] != vocab:
            raise ValueError(
                f"d2t has {d2t.shape[0]} entries but the (draft) logits are {vocab} wide; they must match"
            )
        if d2t.dtype not in _D2T_DTYPES:
            raise ValueError(f"d2t dtype must be int64 or int32, got {d2t.dtype}")
        if d2t.device != logits.device:
            raise ValueError(f"d2t is on {d2t.device}, logits on {logits.device}")
    return mask_vocab


@functools.lru_cache(maxsize=16)
def _bit_shifts(device: torch.device) -> torch.Tensor:
    """``31 - j`` for j in 0..31 (int32): moves bit j of a word to the sign bit."""
    return 31 - torch.arange(32, dtype=torch.int32, device=device)


def _disallowed_words(bitmask: torch.Tensor, vocab: int, mask_vocab: int) -> torch.Tensor:
    """int32 ``[rows, vocab]``: -1 (all ones) where the column is disallowed, else 0."""
    rows = bitmask.shape[0]
    covered = min(vocab, mask_vocab)  # columns that read a bit; the rest are padding
    words = -(-covered // 32)
    # (~word << (31 - j)) >> 31 (arithmetic): bit j of ~word smeared over the whole int32.
    inverted = bitmask[:, :words].bitwise_not()
    flags = (inverted.unsqueeze(-1) << _bit_shifts(bitmask.device)).view(rows, words * 32)
    flags >>= 31
    if covered == vocab:
        return flags[:, :vocab]
    out = flags.new_full((rows, vocab), -1)  # columns >= mask_vocab: padding, disallowed
    out[:, :covered] = flags[:, :covered]
    return out


def _disallowed_words_d2t(bitmask: torch.Tensor, d2t: torch.Tensor, mask_vocab: int) -> torch.Tensor:
    """Same as `_disallowed_words` for draft columns mapped to target tokens by ``d2t``."""
    target = d2t.to(torch.int64) + torch.arange(d2t.shape[0], dtype=torch.int64, device=d2t.device)
    out_of_range = (target < 0) | (target >= mask_vocab)
    target = target.masked_fill(out_of_range, 0)
    rows, words_per_row = bitmask.shape
    # Gather each row's word for every draft column from the flattened bitmask (much faster
    # on CPU than index_select along dim 1).
    flat_index = (target >> 5).unsqueeze(0) + torch.arange(
        0, rows * words_per_row, words_per_row, dtype=torch.int64, device=bitmask.device
    ).unsqueeze(1)
    words = bitmask.contiguous().view(-1).index_select(0, flat_index.view(-1)).view(rows, -1)
    shifts = (31 - (target & 31)).to(torch.int32)
    flags = words.bitwise_not_().bitwise_left_shift_(shifts)
    flags >>= 31
    flags |= out_of_range.to(torch.int32).neg_()  # targets outside the mask: disallowed
    return flags


def apply_mask_inplace_torch(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    needs_mask: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    *,
    mask_vocab: int | None = None,
) -> None:
    """Set disallowed logits to -inf in place (see the module docstring for the semantics).

    Works on any device. On CPU only the rows with ``needs_mask != 0`` are read or written; on
    other devices the row gate is applied arithmetically (no host sync), and rows with
    ``needs_mask == 0`` are rewritten with their own bits, i.e. left bitwise unchanged.
    """
    mask_vocab = check_mask_args(logits, bitmask, needs_mask, d2t, mask_vocab)
    num_rows, vocab = logits.shape
    if num_rows == 0 or vocab == 0:
        return
    int_dtype, neg_inf_bits = _INT_VIEW[logits.dtype]
    bits = logits.view(int_dtype)

    rows: torch.Tensor | None = None  # None: every row
    gate: torch.Tensor | None = None
    if needs_mask is not None:
        if logits.device.type == "cpu":
            selected = needs_mask.nonzero().squeeze(1)
            if selected.numel() == 0:
                return
            if selected.numel() < num_rows:
                rows = selected
                bitmask = bitmask.index_select(0, rows)
        else:
            gate = needs_mask.ne(0).to(torch.int32).neg_().unsqueeze(1)  # -1 / 0 per row

    if d2t is None:
        flags = _disallowed_words(bitmask, vocab, mask_vocab)
    else:
        flags = _disallowed_words_d2t(bitmask, d2t, mask_vocab)
    if gate is not None:
        flags = flags & gate
    if int_dtype != torch.int32:
        flags = flags.to(int_dtype)  # 0 / -1 survive the narrowing (and the widening)

    # x ^= (x ^ NEG_INF) & flags: x where flags == 0, NEG_INF where flags == -1.
    if rows is None:
        delta = bits ^ neg_inf_bits
        delta &= flags
        bits ^= delta
    else:
        sub = bits.index_select(0, rows)
        delta = sub ^ neg_inf_bits
        delta &= flags
        sub ^= delta
        bits.index_copy_(0, rows, sub)
