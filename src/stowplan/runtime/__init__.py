"""A reference stage worker for Hugging Face checkpoints: partial loading, the model's own code.

Needs the ``worker`` extra (``torch``, ``transformers``, ``safetensors``); importing this
package imports none of them (each module imports them where it uses them).

* :mod:`.families` — what the worker runs, and the refusals (pure);
* :mod:`.checkpoint` — the tensors of one stage, read shard by shard, bytes counted;
* :mod:`.stage` — :class:`~stowplan.runtime.stage.StageModel`, the stage's layers built
  with ``transformers`` on the meta device and materialised from those tensors;
* :mod:`.generation` — the whole model in one process, and the comparison;
* :mod:`.pipeline` — the stage actors on Ray and the microbatched generation;
* :mod:`.run` — ``stowplan run``: plan, realise, generate, predict, check;
* :mod:`.make_checkpoint` — random checkpoints with a local tokenizer.
"""

from __future__ import annotations

from stowplan.runtime.families import Family, check_runnable, family_of

__all__ = ["Family", "check_runnable", "family_of"]
