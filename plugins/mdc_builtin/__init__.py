"""mdc's built-in launchers and backends: ordinary plugins, using only ``mdc`` and ``mdc.api``."""
