"""``python -m mdc`` and the ``mdc`` command."""

import gc
import sys


def main() -> None:
    # What the imports build (modules, classes, schemas) lives until the process ends: the
    # cyclic collector would walk it again and again for nothing. run() freezes it and
    # turns the collector back on for the command's own work.
    gc.disable()
    from mdc.cli import run
    from mdc.loaders import MAX_INT_DIGITS

    # Python's own limit on converting integers, which PYTHONINTMAXSTRDIGITS can lower: mdc
    # reads and prints integers of up to this many digits whatever the environment says
    sys.set_int_max_str_digits(MAX_INT_DIGITS)

    run()


if __name__ == "__main__":
    main()
