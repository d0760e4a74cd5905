"""*When* things happen: the SimPy engine that replays a Trace on a cluster."""

from simulator.engine import Faults, SimulationOptions, StepSimulation, simulate
from simulator.result import Breakdown, StepResult

__all__ = ["Breakdown", "Faults", "SimulationOptions", "StepResult", "StepSimulation", "simulate"]
