"""The slurm backend (being written)."""
