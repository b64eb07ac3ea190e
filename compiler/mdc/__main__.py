"""``python -m mdc`` and the ``mdc`` command."""

import gc


def main() -> None:
    # What the imports build (modules, classes, schemas) lives until the process ends: the
    # cyclic collector would walk it again and again for nothing. run() freezes it and
    # turns the collector back on for the command's own work.
    gc.disable()
    from mdc.cli import run

    run()


if __name__ == "__main__":
    main()
