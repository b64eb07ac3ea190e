"""``sbatch --time`` read as SLURM reads it (src/common/parse_time.c ``time_str2mins``), so that
mdc refuses exactly the time limits sbatch refuses ("Invalid --time specification").

SLURM checks only the shape: ASCII digits, at most one '-' (before any ':'), at most two
':', and a run of digits for each field the separators announce (``10:`` and ``-0:30`` are
refused). It does not check the range of a field: ``25:61:61`` is 25 hours, 61 minutes and
61 seconds, and ``0-100`` is 100 hours. The fields are then read with C's ``sscanf("%d")``
and summed in 32-bit ``int`` seconds, rounded up to minutes. sbatch (slurm_opt.c, since
SLURM 19.05) refuses only what time_str2mins calls NO_VAL: a negative day count such as
``-5`` is taken (SLURM 22.05 submits it). ``-1``, ``INFINITE`` and ``UNLIMITED`` (any case)
mean no limit, as does 0.
"""

from __future__ import annotations

import re

#: what time_str2secs returns for "no limit" and for a refused shape (uint32 in an int)
INFINITE = -1
NO_VAL = -2
_NUMBER = re.compile(r"[+-]?[0-9]+")
_LONG = 2**63


def _int32(value: int) -> int:
    """``value`` as C's 32-bit ``int`` holds it (two's complement wrap-around)."""
    return (value + 2**31) % 2**32 - 2**31


def _long(digits: str) -> int:
    """glibc's ``strtol`` of a signed run of digits: clamped to a ``long`` on overflow (a run
    too long for one is clamped without converting it: Python refuses over 4,300 digits)."""
    if len(digits.lstrip("+-").lstrip("0")) > 19:
        return -_LONG if digits.startswith("-") else _LONG - 1
    return max(-_LONG, min(int(digits), _LONG - 1))


def _scan(text: str, separators: str) -> list[int]:
    """The ``int`` values ``sscanf`` stores for ``%d<sep>%d<sep>...``: it stops at the first
    field or separator that does not match. glibc reads a field as a ``long`` (clamped on
    overflow), then stores it in the ``int``."""
    values: list[int] = []
    pos = 0
    for index in range(len(separators) + 1):
        found = _NUMBER.match(text, pos)
        if found is None:
            break
        values.append(_int32(_long(found.group())))
        pos = found.end()
        if index == len(separators) or text[pos : pos + 1] != separators[index]:
            break
        pos += 1
    return values


def _valid_timespec(text: str) -> bool:
    """parse_time.c ``_is_valid_timespec``: it counts runs of digits, one per field."""
    runs = dashes = colons = 0
    in_digits = False
    for char in text:
        if char in "0123456789":
            runs += 0 if in_digits else 1
            in_digits = True
            continue
        in_digits = False
        if char == "-":
            dashes += 1
            if colons:
                return False
        elif char == ":":
            colons += 1
        else:
            return False
    if not runs or dashes > 1 or colons > 2:
        return False
    needed = {0: 1, 1: 3, 2: 4} if dashes else {0: 1, 1: 2, 2: 3}
    return runs >= needed[colons]


def _seconds(text: str) -> int:
    """``time_str2secs``: the seconds of a limit, INFINITE, or NO_VAL."""
    if text.lower() in ("-1", "infinite", "unlimited"):
        return INFINITE
    if not _valid_timespec(text):
        return NO_VAL
    if "-" in text:
        days, hours, minutes, seconds = [*_scan(text, "-::"), 0, 0, 0, 0][:4]
    else:
        fields = _scan(text, "::")
        if len(fields) == 3:
            days, (hours, minutes, seconds) = 0, fields
        else:  # minutes[:seconds]
            days, hours, (minutes, seconds) = 0, 0, [*fields, 0, 0][:2]
    total = _int32(_int32(days * 86400) + _int32(hours * 3600))
    return _int32(_int32(total + _int32(minutes * 60)) + seconds)


def time_minutes(text: str) -> int | None:
    """The minutes ``time_str2mins`` reads from ``--time`` (0 and INFINITE: no limit), or
    None when sbatch refuses it (NO_VAL)."""
    seconds = _seconds(text)
    if seconds in (INFINITE, NO_VAL):
        return None if seconds == NO_VAL else INFINITE
    rounded = _int32(seconds + 59)
    minutes = abs(rounded) // 60 * (1 if rounded >= 0 else -1)  # C divides toward zero
    return None if minutes == NO_VAL else minutes
