from mdc.cli import run

run()
