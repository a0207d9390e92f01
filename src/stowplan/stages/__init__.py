"""What one pipeline stage is told: its GPUs and its environment.

* :mod:`~stowplan.stages.worker` — the worker contract (``stage_env``, ``stage_from_env``);
* :mod:`~stowplan.stages.gpu_lists` — how a stage's GPUs are written, for people and CUDA.
"""
