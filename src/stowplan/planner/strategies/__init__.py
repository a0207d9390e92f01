"""The block strategies: which nodes, in which order, hold which blocks.

* :mod:`~stowplan.planner.strategies.vram` — the seed's balance-by-vram (fewest stages,
  blocks split by VRAM);
* :mod:`~stowplan.planner.strategies.latency` — least time per token;
* :mod:`~stowplan.planner.strategies.throughput` — the least slowest stage (and
  :data:`~stowplan.planner.strategies.throughput.Pipeline`, what every search returns);
* :mod:`~stowplan.planner.strategies.cycle` — the stage counts searched, pipelines ranked by
  the cycle.
"""
