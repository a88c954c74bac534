"""Rows of probabilities ranked in decreasing order, with their cumulative mass, ties and APS / RAPS scores.

Few classes: a float sort of the rows (``_Ranked``). At least ``RANK_MIN_CLASSES``: one sort of integer keys built
from the probabilities' IEEE-754 bit patterns and the class (``_KeyRanking``), and the one-threshold set sizes from
block sums of the ranked probabilities (``_block_sizes``), exact within the error bound of sums of non-negative
terms (Higham 2002, section 4.2); the rows they cannot settle go back to the float sort. The reasons and the figures:
docs/decisions/0023-key-ranked-sets.md.
"""

from __future__ import annotations

import functools

import numpy as np

from calibkit.conformal._checks import SCORE_ATOL

#: One-threshold sets of at least this many classes rank each row by one sort of packed integer keys
#: (``_KeyRanking``), and find an APS / RAPS set's size from block sums of the ranked probabilities
#: (``_block_sizes``); rows of fewer classes are sorted as floats, which costs less.
#: ``sets`` reads it as ``_ranking.RANK_MIN_CLASSES``, so that one assignment (a test's) reaches every path.
RANK_MIN_CLASSES = 64
#: The number of ranked positions per block sum.
BLOCK = 32


class _Ranked:
    """Rows of probabilities sorted in decreasing order, or their top labels, with the cumulative mass and ties.

    For sorted position j (1-based): ``values`` p_(j) and ``cumsum`` C(j) = p_(1) + ... + p_(j); ``groups()`` the
    first and last position of j's tie group, computed when needed, as C is. ``order`` is the ranking, when asked
    for.
    Built from the top labels only (``top``), C(j) is the same number as from the whole row, and only the last
    tie group, which may go on past the prefix, can have the wrong last position.
    """

    def __init__(self, values: np.ndarray, order: np.ndarray | None = None) -> None:
        self.values = values
        self.order = order
        self.positions = np.arange(1, values.shape[1] + 1)
        self._groups: tuple[np.ndarray, np.ndarray] | None = None
        self._ties: bool | None = None

    @functools.cached_property
    def cumsum(self) -> np.ndarray:
        return np.cumsum(self.values, axis=1)

    @classmethod
    def sort(cls, p: np.ndarray, *, with_order: bool = False) -> _Ranked:
        """The whole rows, sorted (with the ranking when asked: a tie's order is arbitrary and never matters; the
        key ranking for many classes, its unstable rows argsorted)."""
        if not with_order:
            return cls(np.sort(p, axis=1)[:, ::-1])
        if p.shape[1] >= RANK_MIN_CLASSES:
            order = _KeyRanking(p).stable_order()
        else:
            order = np.argsort(p, axis=1)[:, ::-1]
        return cls(np.take_along_axis(p, order, axis=1), order)

    @classmethod
    def top(cls, p: np.ndarray, width: int) -> _Ranked:
        """The ``width`` largest probabilities of each row, sorted: a partition, then a sort of the few."""
        kth = p.shape[1] - width
        return cls(np.sort(np.partition(p, kth, axis=1)[:, kth:], axis=1)[:, ::-1])

    def groups(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(first, last) position of each position's tie group, or None when no probabilities tie."""
        if self._ties is None:
            same = self.values[:, 1:] == self.values[:, :-1]
            self._ties = bool(same.any())
            if self._ties:
                width = self.values.shape[1]
                starts = np.ones(self.values.shape, dtype=bool)
                starts[:, 1:] = ~same
                first = np.maximum.accumulate(np.where(starts, self.positions, 0), axis=1)
                ends = np.ones(self.values.shape, dtype=bool)
                ends[:, :-1] = starts[:, 1:]
                last = np.minimum.accumulate(np.where(ends, self.positions, width)[:, ::-1], axis=1)[:, ::-1]
                self._groups = first, last
        return self._groups

    def penalty(self, k_reg: int, lam: float) -> np.ndarray:
        """lam (j - k_reg)^+ for positions j = 1..K."""
        return _position_penalty(self.values.shape[1], k_reg, lam)

    def mass_above(self, k_reg: int, lam: float) -> np.ndarray:
        """E(j) = C(j) + lam (j - k_reg)^+, the non-randomized crossing values, nondecreasing in j."""
        return self.cumsum if lam == 0 else self.cumsum + self.penalty(k_reg, lam)

    def scores(self, k_reg: int, lam: float, draws: np.ndarray | None) -> np.ndarray:
        """The APS / RAPS score of the label at each sorted position, nondecreasing along each row.

        s = C(first) - u p_(j) + lam (last - k_reg)^+: the mass above the tie group plus the label's own
        probability, less the randomized part. The running maximum changes nothing in exact arithmetic (the score
        grows with the position) and keeps it so in floating point, so a set is always a top group of labels.
        """
        penalty = self.penalty(k_reg, lam)
        groups = self.groups()
        if groups is None:
            own, pen = self.cumsum, penalty
        else:
            own = np.take_along_axis(self.cumsum, groups[0] - 1, axis=1)
            pen = penalty[groups[1] - 1]
        if draws is None:
            return own + pen
        return np.maximum.accumulate(own - draws[:, None] * self.values + pen, axis=1)

    def statistic(self, k_reg: int, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """(E(m), m == 0) per sorted position, m = first - 1 the number of more probable labels."""
        mass = np.concatenate([np.zeros((self.values.shape[0], 1)), self.mass_above(k_reg, lam)], axis=1)
        groups = self.groups()
        first = np.broadcast_to(self.positions, self.values.shape) if groups is None else groups[0]
        return np.take_along_axis(mass, first - 1, axis=1), first == 1

    def unsort(self, sorted_values: np.ndarray) -> np.ndarray:
        """Values per sorted position back in the original class order."""
        assert self.order is not None
        out = np.empty_like(sorted_values)
        np.put_along_axis(out, self.order, sorted_values, axis=1)
        return out


@functools.lru_cache(maxsize=64)
def _position_penalty(width: int, k_reg: int, lam: float) -> np.ndarray:
    """RAPS's penalty of the positions 1..``width``, computed once per (width, k_reg, lam), read-only."""
    penalty = _rank_penalty(np.arange(1, width + 1), k_reg, lam)
    penalty.setflags(write=False)
    return penalty


def _rank_penalty(ranks: np.ndarray, k_reg: int, lam: float) -> np.ndarray:
    """lam (m - k_reg)^+ for integer ranks m: RAPS's penalty, one expression for every path (Angelopoulos et al.
    2021), so that the paths' sets agree to the bit."""
    return lam * np.maximum(0.0, (ranks - k_reg).astype(np.float64))


class _KeyRanking:
    """Each row's labels in decreasing probability, ties in class order, by one sort of integer keys.

    The IEEE-754 bit patterns of non-negative floats order as the floats do. Label k's key keeps the leading bits
    of p_k's pattern and puts k in the b = bit_length(K - 1) trailing ones: key = ~(bits(p_k) | (2^b - 1)) | k,
    inverted so that the ascending sort ranks the most probable first, then by class. ``values`` are the
    probabilities so truncated (each within a relative 2^(b - 52) below the true one), in ranked order, padded
    with zeros to a multiple of ``BLOCK`` columns. Per row, ``stable``: no -0.0, and no two labels whose keys
    share their leading bits but whose probabilities differ (a near-tie, which the keys may rank out of order), so
    that ``order`` is the stable ranking; ``singles``: the number of leading positions before the first tie (K
    without one). Probabilities of float32 origin lose nothing to the truncation: their only shared leading bits
    are ties.
    """

    def __init__(self, p: np.ndarray) -> None:
        self.p = p
        n, k = p.shape
        low = (1 << max(1, (k - 1).bit_length())) - 1
        keys = np.empty((n, -(-k // BLOCK) * BLOCK), dtype=np.int64)
        head = keys[:, :k]
        np.bitwise_or(p.view(np.int64), low, out=head)
        head ^= _inverted_classes(k)  # ~(x | low) | k == (x | low) ^ ~k: the low bits of ~(x | low) are zero
        keys[:, k:] = np.iinfo(np.int64).max  # padding: ranked last, read as the value -0.0
        keys.sort(axis=1)
        self.order = keys[:, :k] & low
        no_negative = keys[:, k - 1] < 0  # a -0.0 (bits with the sign set) keys as a non-negative integer
        keys |= low
        np.invert(keys, out=keys)
        self.values = keys.view(np.float64)
        ranked = self.values[:, :k]
        shared = ranked[:, 1:] == ranked[:, :-1]
        self.stable = no_negative
        self.singles = np.full(n, k)
        tied = np.flatnonzero(shared.any(axis=1))
        if len(tied):
            at, j = np.nonzero(shared[tied])
            rows = tied[at]
            near = p[rows, self.order[rows, j]] != p[rows, self.order[rows, j + 1]]
            self.stable = no_negative & (np.bincount(rows[near], minlength=n) == 0)
            self.singles[tied] = np.argmax(shared[tied], axis=1)

    def stable_order(self) -> np.ndarray:
        """``order``, with the rows that are not stable argsorted stably from the true probabilities (in place)."""
        if not self.stable.all():
            self.order[~self.stable] = np.argsort(-self.p[~self.stable], axis=1, kind="stable")
        return self.order

    def settles(self, sizes: np.ndarray, randomized: bool) -> np.ndarray:
        """Whether the sizes found from ``values`` position by position are the sets' own: the ranking is stable
        and, randomized, the set lies before the first tie. A tie group's randomized score takes the penalty of
        its last rank, at least its first position's: a first position found out is out."""
        if not randomized:
            return self.stable
        return self.stable & ((self.singles == self.order.shape[1]) | (sizes <= self.singles))


@functools.lru_cache(maxsize=8)
def _ones(n: int) -> np.ndarray:
    """n ones, read-only: a product with them sums blocks faster than ``sum`` does, in BLAS's order."""
    out = np.ones(n)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _inverted_classes(k: int) -> np.ndarray:
    """~k for the classes k = 0..K - 1, read-only."""
    out = ~np.arange(k, dtype=np.int64)
    out.setflags(write=False)
    return out


def _block_sizes(values: np.ndarray, k: int, q: float, k_reg: int, lam: float, draws) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, settled): the one-threshold APS / RAPS set sizes of ranked rows, from block sums, and which rows
    they decide.

    The crossing values grow with the position j: E(j) = C(j) + lam (j - k_reg)^+, the set's size being
    1 + #{j : E(j) < q} (non-randomized), and the scores C(j) - u p_(j) + lam (j - k_reg)^+, the size being
    #{j : score <= q} (randomized), as in ``_one_threshold_sets``. The running total of the block sums gives C at
    the last position of every block of ``BLOCK``, so the blocks wholly in are counted from it, and only the first
    block not wholly in is summed position by position. Summed in another order than the sorted running sum, and
    from truncated values, these masses differ from it by at most gamma = 8 (K + BLOCK + 8) 2^-53 (1 + 2 |q| +
    lam K) (Higham 2002, section 4.2, for sums of non-negative terms): a comparison counts only when it clears the
    threshold by more than gamma, and a row with a position closer than that is not settled.
    """
    n, width = values.shape
    n_blocks = width // BLOCK
    blocks = values.reshape(n, n_blocks, BLOCK)
    mass = np.zeros((n, n_blocks + 1))
    np.cumsum(blocks @ _ones(BLOCK), axis=1, out=mass[:, 1:])
    penalty = _position_penalty(width, k_reg, lam)
    gap = 8.0 * (k + BLOCK + 8) * 2.0**-53 * (1.0 + 2.0 * abs(q) + lam * k)
    last = mass[:, 1:] + penalty[BLOCK - 1 :: BLOCK]  # at each block's last position
    if draws is None:
        wholly_in = np.count_nonzero(last - q < -SCORE_ATOL - gap, axis=1)
    else:
        last -= draws[:, None] * values[:, BLOCK - 1 :: BLOCK]
        wholly_in = np.count_nonzero(last - q <= SCORE_ATOL - gap, axis=1)
    b = np.minimum(wholly_in, n_blocks - 1)
    rows = np.arange(n)
    own = blocks[rows, b]
    score = np.cumsum(own, axis=1)
    score += mass[rows, b][:, None]
    score += penalty[(b * BLOCK)[:, None] + np.arange(BLOCK)]
    if draws is None:
        d = score - (q - SCORE_ATOL)  # in when below zero
        counted = np.count_nonzero(d < -gap, axis=1)
        unsure = ((d >= -gap) & (d < gap)).any(axis=1)
        sizes = b * BLOCK + counted + 1
    else:
        score -= draws[:, None] * own
        d = score - (q + SCORE_ATOL)  # in when at most zero
        counted = np.count_nonzero(d <= -gap, axis=1)
        unsure = ((d > -gap) & (d <= gap)).any(axis=1)
        sizes = b * BLOCK + counted
    # a block all in that is not the last: its end was not in by the block sums, a rounding apart
    unsure |= (counted == BLOCK) & (wholly_in < n_blocks)
    return np.minimum(sizes, k), ~unsure
