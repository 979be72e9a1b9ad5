"""Page arithmetic: the small pure functions every range free and allocation rests on.

Integers only (no I/O, no torch). proofs/ proves their lemmas with z3 for a symbolic
page size; CrossHair checks the contracts written in their docstrings
(`pre:` / `post:` lines, PEP 316 style).
"""
from __future__ import annotations


def ceil_div(x: int, p: int) -> int:
    """
    pre: p >= 1
    post: __return__ * p >= x
    post: (__return__ - 1) * p < x
    """
    return -(-x // p)


def ceil_align(x: int, p: int) -> int:
    """`utils.common.ceil_align`: the smallest multiple of p that is >= x.
    pre: p >= 1
    post: __return__ >= x
    post: __return__ - x < p
    post: __return__ % p == 0
    """
    return ceil_div(x, p) * p


def floor_align(x: int, p: int) -> int:
    """`page_align_floor`: the largest multiple of p that is <= x.
    pre: p >= 1
    post: __return__ <= x
    post: x - __return__ < p
    post: __return__ % p == 0
    """
    return (x // p) * p


def row_pages(start: int, end: int, p: int) -> range:
    """Row-page indices touched by positions [start, end): what `free(row[start:end])`
    releases, since the allocator frees whole pages (`unique(index // P)`).
    pre: p >= 1
    pre: 0 <= start
    post: (len(__return__) == 0) == (end <= start)
    """
    if end <= start:
        return range(0)
    return range(start // p, (end - 1) // p + 1)


def free_kv_aligned_start(target: int, p: int) -> int:
    """`_free_kv_aligned`: the first freed position, ceil_align(target) (target if P == 1).
    pre: p >= 1
    pre: target >= 0
    post: __return__ >= target
    post: __return__ % p == 0
    """
    return ceil_align(target, p) if p > 1 else target


def free_kv_aligned_pages(target: int, end: int, p: int) -> range:
    """Row pages freed by `_free_kv_aligned(row, target, end)`: nothing when end <= target,
    else the pages of [ceil_align(target), end). The page holding position target - 1
    (and positions [target, ceil_align(target))) stays attached.
    pre: p >= 1
    pre: target >= 0
    post: all(k * p >= target for k in __return__)
    """
    if end <= target:
        return range(0)
    return row_pages(free_kv_aligned_start(target, p), end, p)


def pages_needed_extend(prefix: int, seq: int, p: int) -> int:
    """`get_num_new_pages`: new pages `alloc_extend(prefix -> seq)` consumes: the partial
    last page is continued first.
    pre: p >= 1
    pre: 0 <= prefix <= seq
    post: __return__ >= 0
    post: __return__ * p >= seq - ceil_align(prefix, p)
    """
    return ceil_div(seq, p) - ceil_div(prefix, p)


def decode_needs_new_page(pos: int, p: int) -> bool:
    """`alloc_decode` writing row position `pos` (seq_len_next = pos + 1) takes a new page
    iff pos is the first position of its page: seq_len_next % P == 1 % P (always for P = 1).
    pre: p >= 1
    pre: pos >= 0
    post: __return__ == ((pos + 1) % p == 1 % p)
    """
    return pos % p == 0


def owned_tokens(protected: int, allocated: int, p: int) -> int:
    """Tokens an owner answers for beyond the tree: `ceil_align(allocated) - protected`
    (`session_held_tokens`, busy `uncached`).
    pre: p >= 1
    pre: 0 <= protected <= allocated
    pre: protected % p == 0
    post: __return__ >= 0
    """
    return ceil_align(allocated, p) - protected


def trim_overshoot_lengths(committed: int, allocated: int, target: int) -> tuple[int, int]:
    """`_trim_overshoot`: (committed, allocated) after capping at target.
    pre: 0 <= committed <= allocated
    post: __return__ == (min(committed, target), min(allocated, target))
    post: __return__[0] <= __return__[1]
    """
    return min(committed, target), min(allocated, target)


def free_tail_lengths(committed: int, allocated: int, prefix_len: int) -> tuple[int, int]:
    """`_free_tail`: (committed, allocated) of slot and request after the restore.
    pre: 0 <= committed <= allocated
    pre: 0 <= prefix_len <= committed
    post: __return__ == (prefix_len, prefix_len)
    """
    return min(committed, prefix_len), prefix_len


def restore_prefix_len(committed: int, input_len: int) -> int:
    """`try_match_prefix`: `min(kv_committed_len, len(key))`, key = input_len - 1 tokens.
    pre: input_len >= 1
    post: __return__ <= committed
    post: __return__ <= input_len - 1
    """
    return min(committed, input_len - 1)


def chunk_end(prefix: int, input_len: int, chunk_size: int | None, p: int) -> int:
    """End of the next prefill chunk: the whole input, or `prefix + chunk_size // P * P`
    (`PrefillAdder` truncates a chunk to whole pages).
    pre: p >= 1
    pre: 0 <= prefix < input_len
    pre: chunk_size is None or chunk_size >= p
    post: prefix < __return__ <= input_len
    """
    if chunk_size is None:
        return input_len
    return min(input_len, prefix + (chunk_size // p) * p)


def reserve_chunk_end(prefix: int, input_len: int, chunk_size: int | None, p: int) -> int:
    """`add_one_req`'s extend end (0.5.15 `schedule_policy.py` l.1081-1120, 0.5.23
    l.1650-1671): the whole input when its page-ceiled extend fits the chunk budget, else
    a chunk of `chunk_size // P * P` tokens cut back to a page boundary of the sequence
    (`(prefix + trunc) // P * P`); `prefix` itself when that leaves nothing
    (AddReqResult.OTHER: the request is refused).
    pre: p >= 1
    pre: 0 <= prefix < input_len
    post: prefix <= __return__ <= input_len
    """
    if chunk_size is None or ceil_align(input_len - prefix, p) <= chunk_size:
        return input_len
    return max(prefix, (prefix + chunk_size // p * p) // p * p)


def segment_trim(prev_end: int, start: int, n: int, p: int) -> tuple[int, int]:
    """`free_segments` boundary rule: a segment [start, start+n) whose first page is the
    previous segment's last page is trimmed to start at the next page boundary.
    Returns (new_start, new_n); new_n <= 0 means the segment lies inside the shared page
    and emits nothing (callers clamp with max(0, n)).
    pre: p >= 1
    pre: 0 < prev_end <= start
    pre: n >= 0
    post: __return__[0] // p > (prev_end - 1) // p or __return__[1] <= 0
    """
    if start // p == (prev_end - 1) // p:
        boundary = (start // p + 1) * p
        return boundary, n - (boundary - start)
    return start, n
