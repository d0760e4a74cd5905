"""Failure studies: the ``failures:`` config section, the seeded long-horizon runs and their
summary, checkpoint-interval sweeps, and what a study prints and plots."""
