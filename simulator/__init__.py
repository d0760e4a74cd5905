"""*When* things happen: the SimPy engine that replays a Trace on a cluster."""

from clustersim.simulator.engine import Faults, SimulationOptions, StepSimulation, simulate
from clustersim.simulator.result import Breakdown, StepResult

__all__ = ["Breakdown", "Faults", "SimulationOptions", "StepResult", "StepSimulation", "simulate"]
