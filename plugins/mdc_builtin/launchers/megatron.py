"""The megatron launcher (being written)."""
