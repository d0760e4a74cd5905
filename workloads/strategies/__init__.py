"""One module per parallelism, each emitting its part of a stage's program: ``tensor``
(TP and sequence parallelism), ``context`` (ring attention), ``expert`` (all-to-all dispatch
and combine), ``data`` (gradient reductions, ZeRO, the optimizer step), ``pipeline`` (schedules
and stage-to-stage sends); ``program`` holds the op list they share."""
