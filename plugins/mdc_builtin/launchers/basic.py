"""The basic launcher (being written)."""
