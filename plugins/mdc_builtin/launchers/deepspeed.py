"""The deepspeed launcher (being written)."""
