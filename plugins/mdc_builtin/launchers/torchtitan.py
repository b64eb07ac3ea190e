"""The torchtitan launcher (being written)."""
