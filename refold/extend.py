"""refold's extension API: what a package adds to refold itself, beside its processors.

Import from here (``from refold.extend import Engine, register_engine``). Like
``refold.__all__``, these names are kept stable across releases; anything imported from
refold's other modules is internal.

- **Engines** (how a processor runs): subclass :class:`Engine`, say which processors it runs
  (``matches``) and start their query (``start``, given a :class:`QueryStart`: the source
  stream, the checkpoint, the trigger, the generation); every other answer has a default.
  Register it with :func:`register_engine` when your package is imported (the module that
  defines the processor's projection): an added engine is asked before the built-in ones. The
  runner does the rest (generations, leases, restarts, replay). ``start`` returns the
  ``foreachBatch`` sink (a :class:`RunningSink`, whose ``total`` says what it did) and the
  started query. Exactly once is the engine's: Spark runs a batch again with the same id
  after a crash, so a sink that commits the batch id with the batch's writes applies it once.

Importing this module is light (no Spark): a package that registers an engine can be listed by
``refold processors`` without the ``spark`` extra.
"""

from __future__ import annotations

from refold.processors.runtime.engines import (
    Engine as Engine,
    QueryStart as QueryStart,
    RunningSink as RunningSink,
    SinkTotal as SinkTotal,
    register_engine as register_engine,
)

__all__ = ["Engine", "QueryStart", "RunningSink", "SinkTotal", "register_engine"]
