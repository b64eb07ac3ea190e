"""The primus launcher (being written)."""
