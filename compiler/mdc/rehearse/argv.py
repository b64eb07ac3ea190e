"""Reading the argument lists the stand-ins recorded, as the programs' argparse reads them."""

from __future__ import annotations


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` (``--flag V`` or ``--flag=V``); the last one wins, as argparse."""
    found = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
    return found
