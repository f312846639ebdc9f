"""Level 2 points a worker's Arrow at its system pool, which memray sees (see
tracer.ray.arrow_memory); a pool the user chose is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")

_SWITCH = "from tracer.ray.arrow_memory import arrow_on_system_pool; arrow_on_system_pool()\n"
_POOL = ("import pyarrow as pa; pa.allocate_buffer(1)\n"
         "print(pa.default_memory_pool().backend_name)\n")


def _pool_after(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environ, **env}, timeout=60, check=True)
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def own_pool() -> str:
    """This pyarrow's default pool by itself; a build on the system pool has nothing
    to switch (every assertion below would hold whatever the code did)."""
    pool = _pool_after(_POOL)
    if pool == "system":
        pytest.skip("this pyarrow's default pool is already the system pool")
    return pool


def test_arrow_loaded_and_used_moves_to_its_system_pool(own_pool: str) -> None:
    assert _pool_after(_POOL + _SWITCH + _POOL).splitlines() == [own_pool, "system"]


def test_arrow_not_loaded_yet_starts_on_its_system_pool(own_pool: str) -> None:
    assert _pool_after(_SWITCH + _POOL) == "system"


def test_a_pool_the_user_chose_is_kept(own_pool: str) -> None:
    assert _pool_after(_SWITCH + _POOL, ARROW_DEFAULT_MEMORY_POOL=own_pool) == own_pool
