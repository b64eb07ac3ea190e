"""``python -m mdc`` and the ``mdc`` command."""

import sys


def main() -> None:
    from mdc.cli import run
    from mdc.loaders import MAX_INT_DIGITS

    # Python's own limit on converting integers, which PYTHONINTMAXSTRDIGITS can lower: mdc
    # reads and prints integers of up to this many digits whatever the environment says
    sys.set_int_max_str_digits(MAX_INT_DIGITS)

    run()


if __name__ == "__main__":
    main()
