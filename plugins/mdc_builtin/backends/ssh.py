"""The ssh backend (being written)."""
