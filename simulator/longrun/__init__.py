"""The long-run failure simulator: weeks of a training job under failures, with the step time
(from the step engine) as the unit of work.

``job_run`` plays one run as SimPy processes (node failures from ``fleet``, stragglers, degraded
links, checkpoints in closed form from ``cycle``, recoveries from ``recovery``); ``montecarlo``
repeats it over seeds; ``checkpointing`` turns a checkpoint's bytes into pause and restore times
(``checkpoint_state`` reads those bytes off a job); ``fault_impact`` runs the step engine with
one faulted rank to say where the extra time goes; ``plan`` holds a run's inputs and outputs.
"""
