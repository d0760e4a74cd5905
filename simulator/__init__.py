"""*When* things happen: the step engine that replays a Trace on a cluster (``engine``: records
of who did what when), the attribution of each rank's idle time along its critical path
(``attribution``), the step's metrics (``metrics``), the cost models behind one small interface
each (``cost/interfaces.py``), and the long-run failure simulator (``longrun/``)."""

from clustersim.simulator.engine import Faults, SimulationOptions, StepSimulation, simulate
from clustersim.simulator.records import Replay
from clustersim.simulator.result import Breakdown, StepResult

__all__ = ["Breakdown", "Faults", "Replay", "SimulationOptions", "StepResult", "StepSimulation",
           "simulate"]
