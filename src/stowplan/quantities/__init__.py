"""What a user may write, and how much: units, the caps on every size, the value checks.

* :mod:`~stowplan.quantities.units` — ``"24GiB"``, ``"20tok/s"``, ``"1Gbit"`` parsed;
* :mod:`~stowplan.quantities.limits` — the largest sizes stowplan accepts;
* :mod:`~stowplan.quantities.checks` — checks of user-given values, one wording for all.
"""
