"""Rank groups as Megatron-Core's rank generator lays them out, without torch.

Ranks are mixed-radix numbers over the parallel axes in ``order`` (fastest
first): ``rank = sum(coord[a] * stride[a])`` with ``stride[a]`` the product of
the sizes before ``a``. A group of kind ``"tp-pp"`` varies the tp and pp
coordinates and fixes the others. Groups are numbered by the fixed
coordinates and ranks within a group by the varied ones, both fastest axis
first — the order Megatron-Core's ``generate_masked_orthogonal_rank_groups``
produces. Nothing is enumerated until asked for, so a million-rank plan costs
a few integers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from math import prod

import attrs

AXES = ("tp", "cp", "ep", "dp", "pp")


def complete_order(order: str, sizes: dict[str, int]) -> tuple[str, ...]:
    """The order's axes with any missing size-1 axes appended (as Megatron-Core does).

    Raises ``ValueError`` naming an axis of size > 1 that the order leaves out.
    """
    tokens = tuple(order.split("-"))
    missing = [a for a in AXES if a not in tokens and sizes[a] != 1]
    if missing:
        raise ValueError(missing[0])
    return tokens + tuple(a for a in AXES if a not in tokens)


@attrs.frozen
class RankGrid:
    """The ranks as a grid over ``axes`` (fastest first) with ``sizes``."""

    axes: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return prod(self.sizes)

    @property
    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for size in self.sizes:
            out.append(acc)
            acc *= size
        return tuple(out)

    def size_of(self, axis: str) -> int:
        return self.sizes[self.axes.index(axis)]

    def groups(self, kind: str) -> GroupSet:
        """The groups that vary the axes named in ``kind`` (e.g. ``"tp"``, ``"dp-cp"``)."""
        return _groups(self, kind)


# A plan's checks and its plugins ask a grid for the same kinds again and again, and specs
# (or a tune's layouts) share grids: a GroupSet is immutable, so one is made per question.
@functools.lru_cache(maxsize=4096)
def _groups(grid: RankGrid, kind: str) -> GroupSet:
    varied = set(kind.split("-"))
    unknown = varied - set(grid.axes)
    if unknown:
        raise ValueError(f"unknown axis {min(unknown)!r} in {kind!r}")
    inner = tuple(i for i, a in enumerate(grid.axes) if a in varied)
    outer = tuple(i for i, a in enumerate(grid.axes) if a not in varied)
    strides = grid.strides
    return GroupSet(
        kind=kind,
        inner_sizes=tuple(grid.sizes[i] for i in inner),
        inner_strides=tuple(strides[i] for i in inner),
        outer_sizes=tuple(grid.sizes[i] for i in outer),
        outer_strides=tuple(strides[i] for i in outer),
    )


def _compose(index: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Map a mixed-radix index (fastest digit first) onto ranks through ``strides``."""
    rank = 0
    for size, stride in zip(sizes, strides, strict=True):
        index, digit = divmod(index, size)
        rank += digit * stride
    return rank


def _all_composed(sizes: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """``_compose(i, sizes, strides)`` for every ``i``, in order, built digit by digit."""
    ranks = [0]
    for size, stride in zip(sizes, strides, strict=True):
        ranks = [rank + digit * stride for digit in range(size) for rank in ranks]
    return ranks


@attrs.frozen
class GroupSet:
    """All groups of one kind; group ``i`` and the group of a rank are computed on demand."""

    kind: str
    inner_sizes: tuple[int, ...]
    inner_strides: tuple[int, ...]
    outer_sizes: tuple[int, ...]
    outer_strides: tuple[int, ...]

    @property
    def group_size(self) -> int:
        return prod(self.inner_sizes)

    @property
    def count(self) -> int:
        return prod(self.outer_sizes)

    def __len__(self) -> int:
        return self.count

    def base(self, index: int) -> int:
        """The lowest rank of group ``index``."""
        if not 0 <= index < self.count:
            raise IndexError(index)
        return _compose(index, self.outer_sizes, self.outer_strides)

    def __getitem__(self, index: int) -> tuple[int, ...]:
        base = self.base(index)
        return tuple(
            base + _compose(j, self.inner_sizes, self.inner_strides) for j in range(self.group_size)
        )

    def head(self, index: int, count: int) -> tuple[int, ...]:
        """The first ``count`` ranks of group ``index`` (all when the group is smaller):
        a listing of a huge group costs what it shows."""
        base = self.base(index)
        shown = min(count, self.group_size)
        return tuple(base + _compose(j, self.inner_sizes, self.inner_strides) for j in range(shown))

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        # every group is its base plus the same offsets
        offsets = _all_composed(self.inner_sizes, self.inner_strides)
        for base in _all_composed(self.outer_sizes, self.outer_strides):
            yield tuple(map(base.__add__, offsets))

    def index_of(self, rank: int) -> int:
        """Which group ``rank`` belongs to."""
        index, scale = 0, 1
        for size, stride in zip(self.outer_sizes, self.outer_strides, strict=True):
            index += (rank // stride) % size * scale
            scale *= size
        return index

    @property
    def span(self) -> int:
        """Highest minus lowest rank within any group (the same for every group)."""
        return sum((s - 1) * t for s, t in zip(self.inner_sizes, self.inner_strides, strict=True))

    def group_crossing(self, block: int) -> int | None:
        """A group with ranks in two blocks of ``block`` consecutive ranks (nodes), if any.

        A group's ranks lie between its base and base + span, so it stays within
        one block iff ``base % block + span < block``. Outer axes whose stride is a
        multiple of ``block`` do not move ``base % block``, so only the others are
        searched.
        """
        if self.span == 0:
            return None
        if self.span >= block:
            return 0
        moving = [
            (i, s, t)
            for i, (s, t) in enumerate(zip(self.outer_sizes, self.outer_strides, strict=True))
            if t % block and s > 1
        ]
        # Combine the moving axes' digits; at most ``block`` distinct offsets survive, and an
        # axis's digits repeat their offsets after block / gcd(stride, block) steps.
        offsets = {0: 0}  # base % block -> the first outer index found giving it
        for i, size, stride in moving:
            scale = prod(self.outer_sizes[:i])
            steps = min(size, block // math.gcd(stride, block))
            combined: dict[int, int] = {}
            for off, idx in offsets.items():
                for d in range(steps):
                    combined.setdefault((off + d * stride) % block, idx + d * scale)
            offsets = combined
        for off in sorted(offsets):
            if off + self.span >= block:
                return offsets[off]
        return None


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending (for hints that suggest sizes)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
