"""The edit distance bubbles are judged by (PGA: "a Levenshtein-like edit distance")."""

from __future__ import annotations


def within(a: bytes, b: bytes, limit: int) -> bool:
    """Whether the Levenshtein distance of ``a`` and ``b`` is at most ``limit``: equal
    lengths are first tried as substitutions only, then a DP limited to the band of width
    ``limit`` around the diagonal, stopped as soon as a whole row exceeds it."""
    if abs(len(a) - len(b)) > limit:
        return False
    if len(a) == len(b) and sum(x != y for x, y in zip(a, b)) <= limit:
        return True
    big = limit + 1
    prev = [j if j <= limit else big for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        lo, hi = max(1, i - limit), min(len(b), i + limit)
        cur = [big] * (len(b) + 1)
        cur[0] = i if i <= limit else big
        for j in range(lo, hi + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j - 1] + cost, prev[j] + 1, cur[j - 1] + 1, big)
        if min(cur[max(0, lo - 1) : hi + 1]) > limit:
            return False
        prev = cur
    return prev[len(b)] <= limit


def similar(a: bytes, b: bytes, fraction: float) -> bool:
    """Two branches are alike when at most ``fraction`` of the longer one (at least one
    base) must change to make one into the other."""
    return within(a, b, max(1, int(fraction * max(len(a), len(b)))))
