"""A mixture-of-experts model's routing: its statistics and where its tokens go.

* :mod:`~stowplan.moe.stats` — expert load and co-activation, read from files;
* :mod:`~stowplan.moe.routing` — selection probabilities, holders and reach, which the
  cost model and the expert planner both read.
"""
