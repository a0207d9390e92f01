"""What a model and a fleet allow a plan: the rules a planner follows and a validator checks.

* :mod:`~stowplan.rules.tensor_parallel` — the tensor-parallel degrees a model allows;
* :mod:`~stowplan.rules.plan_fit` — a plan checked against the model and nodes it names.
"""
