"""The simulator held against measurements: published training runs (step times) and
nccl-tests output (collective times)."""
