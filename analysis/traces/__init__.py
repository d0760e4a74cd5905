"""Recorded traces as workloads: a run config whose ``workload`` is a profiler or Chakra trace,
replayed (re-timed, scaled) on a cluster (``workload``)."""
