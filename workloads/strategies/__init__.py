"""Per-dimension pieces of trace generation: pipeline schedules, and the op emitters."""
