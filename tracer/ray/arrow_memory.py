"""Arrow's buffers, made visible to memray in the Ray workers that level 2 measures.

Arrow's default memory pool in its wheels is mimalloc (or jemalloc): an
allocator of its own that takes memory from the system in big reservations
(mimalloc's first is 1 GiB, by one ``mmap``) and hands out buffers inside
them. memray records the reservation and none of the buffers. Measured
(pyarrow 26, memray 1.20):

* a Ray Data task (Ray 2.60) that held 64 MiB of Arrow buffers had a heap
  peak of 0.5 MiB; in a script, 700 MiB of them showed as 0 MiB;
* on Ray 2.55, the Ray Data task that happened to make its worker's first
  Arrow allocation had a heap peak of 1 GiB, of which 4 MiB was ever resident.

Arrow's *system* pool allocates with ``malloc``, which memray sees buffer by
buffer. So before a worker's first level-2 measurement its Arrow is pointed
there. When pyarrow is not loaded yet, by ``ARROW_DEFAULT_MEMORY_POOL=system``:
Arrow reads it when its default pool is first used, and every allocation,
pyarrow's and Arrow's C++ code's alike, then goes to ``malloc``. When it is
loaded (Ray Data imports it), by ``pyarrow.set_memory_pool``, which is
pyarrow's default only: Arrow's C++ code that allocates without being handed
a pool keeps the pool it started with, so that pool's first reservation is
made now, before memray's tracker starts, by a one-byte allocation (a task
would otherwise be charged it whole), and what that code allocates later
stays unseen. Buffers allocated before stay with the pool that made them.
A worker whose environment names a pool (``ARROW_DEFAULT_MEMORY_POOL``, the
user's choice) keeps it (its first reservation made the same way when pyarrow
is loaded). The process stays on the
system pool for its later, untraced tasks too: ``malloc`` is slower than
mimalloc for many small buffers, which is the cost of measuring them.
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
    pa = sys.modules.get("pyarrow")
    if pa is None:
        if not _users_choice:
            os.environ[ARROW_POOL_ENV] = "system"  # read when its pool is first used
        return
    try:
        # Arrow's C++ default: its first reservation made before memray's tracker starts.
        pa.allocate_buffer(1, memory_pool=pa.default_memory_pool())
        if not _users_choice and pa.default_memory_pool().backend_name != "system":
            pa.set_memory_pool(pa.system_memory_pool())
    except Exception as exc:  # tracing never breaks the task
        logger.debug("tracer: Arrow's memory pool left as it was: %s", exc)
