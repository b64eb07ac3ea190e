"""Kubernetes resource quantities, read as the apiserver reads them (``resource.ParseQuantity``
of k8s.io/apimachinery), so that mdc refuses exactly the quantities the apiserver refuses.

The grammar: an optional sign, then ASCII digits with an optional fraction (``1``, ``1.5``,
``1.``, ``.5``; a bare sign or ``.`` reads as zero), then one suffix: none, ``m``, ``k``,
``M``, ``G``, ``T``, ``P``, ``E`` (powers of 1000), ``Ki`` to ``Ei`` (powers of 1024), or
``e``/``E`` and a signed whole exponent (``1e3``). Digits are ASCII only: Go's parser
compares bytes with '0'..'9', so ``"８"`` or ``"٨Gi"`` are not quantities. A non-zero value
is rounded up to a whole nano (1e-9), and values beyond the apiserver's range are capped,
not refused, so they are not refused here either.
"""

from __future__ import annotations

import math
from decimal import ROUND_UP, Context, Decimal, localcontext

DIGITS = frozenset("0123456789")
#: the characters Go's parser takes into a suffix before an exponent's sign and digits
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
#: suffix -> (base, exponent)
_SUFFIXES = {
    "": (10, 0),
    **{s: (2, 10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: (10, e) for s, e in zip("numkMGTPE", (-9, -6, -3, 3, 6, 9, 12, 15, 18), strict=True)},
}
#: the exponent must parse as a Go int64 (strconv.ParseInt), else the suffix is refused
_INT64 = 2**63
#: the apiserver's cap of a quantity (the largest int64)
MAX = Decimal(_INT64 - 1)
NANO = Decimal("1e-9")
#: beyond this decimal exponent a non-zero value is only ever the cap or one nano
_FAR = 1000


def _digits_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and text[end] in DIGITS:
        end += 1
    return end


def _suffix(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a suffix, or None when the apiserver refuses it (ErrSuffix)."""
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if len(suffix) < 2 or suffix[0] not in "eE":
        return None
    exponent = suffix[1:]
    body = exponent[1:] if exponent[0] in "+-" else exponent
    if not body or any(c not in DIGITS for c in body) or len(body.lstrip("0")) > 19:
        return None  # (more than 19 digits is past int64 before Python converts it)
    if not -_INT64 <= int(exponent) < _INT64:
        return None
    return 10, int(exponent)


def _split(text: str) -> tuple[bool, str, str] | None:
    """(negative, number, suffix) of a quantity's text, or None when Go's parser refuses its
    shape (ErrFormatWrong): letters, then one sign, then digits may follow the number."""
    pos = 1 if text[:1] in ("+", "-") else 0
    whole_end = _digits_end(text, pos)
    number = text[pos:whole_end] or "0"
    end = whole_end
    if end < len(text) and text[end] == ".":
        end = _digits_end(text, end + 1)
        number += "." + (text[whole_end + 1 : end] or "0")
    suffix_start = end
    while end < len(text) and text[end] in _SUFFIX_CHARS:
        end += 1
    if end < len(text) and text[end] in "+-":
        end += 1
    if _digits_end(text, end) != len(text):
        return None
    return text[:1] == "-", number, text[suffix_start:]


def parse_quantity(text: str) -> Decimal | None:
    """The value the apiserver gives a quantity, or None when it refuses the text."""
    if not text:
        return None
    split = _split(text)
    suffix = None if split is None else _suffix(split[2])
    if split is None or suffix is None:
        return None
    negative, number, (base, exponent) = split[0], Decimal(split[1]), suffix
    if number == 0:
        return Decimal(0)
    # the value's decimal exponent: from 10**20 on it is past the cap (and Decimal would
    # overflow computing a value of thousands of digits)
    magnitude = number.adjusted() + exponent * math.log10(base)
    if base == 10 and exponent < -_FAR:
        value = NANO
    elif magnitude > 20:
        value = MAX
    else:
        with localcontext(Context(prec=len(text) + 2 * _FAR, Emax=4 * _FAR, Emin=-4 * _FAR)):
            value = number * Decimal(base) ** exponent
            value = min(value.quantize(NANO, rounding=ROUND_UP), MAX)
    return -value if negative else value


def is_quantity(text: str) -> bool:
    """Whether the apiserver reads ``text`` as a quantity."""
    return parse_quantity(text) is not None
