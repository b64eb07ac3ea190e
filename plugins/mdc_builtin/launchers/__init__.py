"""Built-in launchers, one module each."""
