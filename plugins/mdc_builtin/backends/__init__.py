"""Built-in backends, one module each."""
