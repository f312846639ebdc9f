"""Arrow's buffers, made visible to memray in the Ray workers that level 2 measures.

Arrow's default memory pool in its wheels is mimalloc (or jemalloc): an
allocator of its own that takes memory from the system in big reservations
(mimalloc's first is 1 GiB, by one ``mmap``) and hands out buffers inside
them. memray records the reservation and none of the buffers. Measured
(pyarrow 26, memray 1.20, Ray Data on Ray 2.55 and 2.60):

* a task that held 700 MiB of Arrow buffers had a heap peak of 0 MiB;
* a task that happened to make its worker's first Arrow allocation had a
  heap peak of 1 GiB, of which 4 MiB was ever resident.

Arrow's *system* pool allocates with ``malloc``, which memray sees buffer by
buffer. So before a worker's first level-2 measurement its Arrow is pointed
there: by ``ARROW_DEFAULT_MEMORY_POOL=system`` when pyarrow is not loaded yet
(Arrow reads it at its first allocation), else by
``pyarrow.set_memory_pool``. Buffers allocated before stay with the pool that
made them. A worker whose environment names a pool
(``ARROW_DEFAULT_MEMORY_POOL``, the user's choice) keeps it: memray then sees
that pool as above. The process stays on the system pool for its later,
untraced tasks too: ``malloc`` is slower than mimalloc for many small
buffers, which is the cost of measuring them.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["ARROW_POOL_ENV", "arrow_on_system_pool"]

logger = logging.getLogger("tracer")

#: Arrow's own setting of its default pool (``system``, ``mimalloc``, ``jemalloc``).
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_done_in: int = 0  # the pid of the process this was done in (a forked child does it again)
_users_choice: bool = ARROW_POOL_ENV in os.environ


def arrow_on_system_pool() -> None:
    """Point this process's Arrow at its system pool, once (see the module doc).

    Never raises: a pyarrow that cannot switch keeps its pool, and its buffers
    go unseen by memray as before.
    """
    global _done_in
    pid = os.getpid()
    if _done_in == pid:
        return
    _done_in = pid
    if _users_choice:
        return
    os.environ[ARROW_POOL_ENV] = "system"
    pa = sys.modules.get("pyarrow")
    if pa is None:
        return  # it reads the variable when it first allocates
    try:
        if pa.default_memory_pool().backend_name != "system":
            pa.set_memory_pool(pa.system_memory_pool())
    except Exception as exc:  # tracing never breaks the task
        logger.debug("tracer: Arrow's memory pool left as it was: %s", exc)
