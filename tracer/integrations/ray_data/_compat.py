"""Every difference between the Ray versions the Ray Data integration supports, in one place.

Supported: Ray 2.50 (the floor of tracer's ``ray>=``) up to the newest
(2.60 when this was written). CI runs 2.50 and the installed Ray; the Ray
Data and Ray-events tests were run by hand on every minor release between
(2.51.2 to 2.59.0), and the hooks below read in their sources. Each
difference, with what covers it (tests in ``tests/ray/test_ray_data_compat.py``
unless said otherwise):

1. **Registering a callback** (2.55): up to 2.54 the ``DataContext`` holds
   callback *instances* in its key-value config
   (``execution_callback.add_execution_callback``, one instance shared by
   every execution, and pickled to every task with the context); from 2.55
   it holds *classes* (``custom_execution_callback_classes``), instantiated
   per execution by the planner. :func:`register_callback` /
   :func:`unregister_callback`; the callback keeps its state per executor
   and pickles as a fresh instance, so both work; a shared instance
   (:func:`callbacks_shared`) sets up the operator hook even while tracing
   is off, as it is created once (tested on 2.60's path in CI, on 2.50.0
   and 2.54.1 by hand).
2. **``OpRuntimeMetrics.on_task_submitted``** gained ``task_id`` (2.54;
   before, :func:`ray_task_id_of` reads it from the operator's data task) and
   **``on_task_finished``** gained ``task_exec_stats`` and
   ``task_exec_driver_stats`` (2.55): the hooks take ``*args, **kwargs`` and
   :func:`submitted_args` / :func:`finished_args` read them by name or
   position (tested with both call shapes).
3. **A task's USS peak** is ``BlockExecStats.max_uss_bytes`` on each output
   block's metadata up to 2.54, ``TaskExecWorkerStats.max_uss_bytes`` from
   2.55 (given to ``on_task_finished``; from 2.56 also on the blocks'
   metadata): :func:`uss_of_output`, :func:`uss_of_finished` look in both.
4. **``MapTransformer.apply_transform``** gained a stats reporter (2.57) and
   a ``clock`` keyword (2.60): :class:`~.worker.TracedMapTransformer`
   passes whatever it is given through.
5. **When an operator's transformer is sent to its workers**: put in the
   object store eagerly by ``MapOperator.start`` (2.50-2.53), lazily on
   first use (2.54+), handed to actor-pool actors as they are created in
   ``start``: so it is traced *before* ``start`` runs, by
   :func:`install_start_hook` (``MapOperator.start`` wrapped once per
   process; fused split steps stay traced through ``fuse``). Up to 2.54,
   an execution callback named by ``RAY_DATA_EXECUTION_CALLBACKS`` is
   created only after the first execution's operators started: task pools
   whose transformer is not sent yet are traced then
   (:func:`transformer_not_sent`, 2.53+); the others' tasks, for that
   execution only, from the driver only (a warning says so;
   :func:`~tracer.integrations.ray_data.enable` has no such gap). Tested on
   2.54.1 in a scratch venv, by hand.

6. **All-to-all operators** (:mod:`.all_to_all`): ``AllToAllOperator`` and
   its ``_bulk_fn``, Ray's ``RemoteFunction._remote`` (how every task is
   submitted) and the class whose ``fetch_until_complete`` waits for a round
   (``BaseProgressBar`` in ``ray.data._internal.progress.base_progress`` from
   2.54, ``AbstractProgressBar`` in ``ray.data._internal.progress_bar`` in
   2.52 and 2.53, ``ProgressBar`` there in 2.50): read
   in 2.60's sources (tested there: pull-based and split repartition,
   random shuffle, sorts under both shuffle strategies); where a piece is
   missing, its operators' tasks end when the bulk function returns
   (:func:`progress_bar_class`), or they are not traced (:func:`bulk_fn`).

7. **Actor pools starting** (:mod:`.actors`): an ``ActorPoolMapOperator``'s
   ``_actor_pool`` (``_ActorPool``) with ``_add_pending_actor(actor,
   ready_ref, usage)`` (2.50: ``add_pending_actor(actor, ready_ref)``; an
   actor created), ``pending_to_running(ready_ref)`` (Ray Data saw it
   ready: its ``get_location`` answered, so its ``__init__`` is done; 2.60
   returns the actor or None, 2.50 True or False), the dicts
   ``_pending_actors`` (ready ref -> actor)
   and ``_running_actors`` (actor -> state with ``actor_location``): read in
   2.60's sources and tested there; a pool without them (:func:`actor_pool`
   says None) has its actors' start not drawn.

8. **Queues and backpressure** (sampled at the scheduling steps):
   ``OpState.total_enqueued_input_blocks()`` (2.50:
   ``total_enqueued_input_bundles()``; the executor's ``_topology``
   maps each operator to its state: what Ray Data's progress calls "Queued
   blocks") and the operator's ``_in_task_submission_backpressure`` /
   ``_in_task_output_backpressure`` with their ``_task_*_backpressure_policy``
   names: read in 2.60's sources and tested there; where missing, not drawn
   (:func:`queued_blocks`, :func:`backpressure` say None).

Everything else used (the executor's ``_topology``, ``_resource_manager``,
``_dataset_id``, ``_data_context``; ``op.metrics``, ``op.name``,
``op._ray_remote_args``; ``RefBundle.metadata``/``num_rows``/
``size_bytes``; the resource manager's ``get_global_usage``/
``get_global_limits``) is the same in all of them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from tracer.ray.resources import ResourceRequest

logger = logging.getLogger("tracer")

#: The oldest Ray whose Ray Data has the hooks used here.
MIN_RAY = (2, 50)
MIN_RAY_TEXT = "2.50"
#: The Ray the integration was last tested with (CI runs the installed one).
TESTED_RAY = "2.60.0"


#: Where a DataContext (2.55+) keeps callback classes.
_CLASSES_FIELD = "custom_execution_callback_classes"


def ray_version() -> str:
    import ray

    return str(getattr(ray, "__version__", "0"))


def parse_version(text: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def unsupported_reason(version: str | None = None) -> str | None:
    """Why this Ray cannot be traced (None: it can)."""
    text = ray_version() if version is None else version
    if parse_version(text) < MIN_RAY:
        return (
            f"Ray {text} is too old for tracer's Ray Data integration (it needs Ray "
            f"{MIN_RAY_TEXT} or newer; tested with {TESTED_RAY})"
        )
    return None


# ------------------------------------------------------------ registration (1)


def callbacks_shared() -> bool:
    """Up to 2.54: one callback instance serves every execution of a context (and one
    named in the environment is created after the first execution's operators started)."""
    from ray.data import DataContext

    return _CLASSES_FIELD not in getattr(DataContext, "__dataclass_fields__", {})


def register_callback(context: Any, cls: type) -> None:
    """Add the callback (class 2.55+, instance before) to ``context`` once."""
    classes = getattr(context, _CLASSES_FIELD, None)
    if isinstance(classes, list):
        if cls not in classes:
            classes.append(cls)
        return
    callbacks = _instances(context)
    if not any(isinstance(cb, cls) for cb in callbacks):
        _set_instances(context, [*callbacks, cls()])


def unregister_callback(context: Any, cls: type) -> None:
    classes = getattr(context, _CLASSES_FIELD, None)
    if isinstance(classes, list):
        while cls in classes:
            classes.remove(cls)
        return
    callbacks = _instances(context)
    if any(isinstance(cb, cls) for cb in callbacks):
        _set_instances(context, [cb for cb in callbacks if not isinstance(cb, cls)])


def callback_registered(context: Any, cls: type) -> bool:
    """Whether ``context`` itself names the callback (or a subclass): its classes
    (2.55+) or its instances (before), not those ``RAY_DATA_EXECUTION_CALLBACKS``
    names, which Ray adds as the execution starts."""
    classes = getattr(context, _CLASSES_FIELD, None)
    if isinstance(classes, list):
        return any(isinstance(c, type) and issubclass(c, cls) for c in classes)
    from ray.data._internal.execution import execution_callback as ec

    callbacks = context.get_config(ec.EXECUTION_CALLBACKS_CONFIG_KEY, None) or ()
    return any(isinstance(cb, cls) for cb in callbacks)


def _instances(context: Any) -> list[Any]:
    """The callback instances of a context (Ray before 2.55), read from its config itself.

    Not through ``execution_callback.get_execution_callbacks``: that marks the
    context's ``RAY_DATA_EXECUTION_CALLBACKS`` as read, and every DataContext
    copied from it (every later Dataset's) would then ignore that variable.
    Where the context has none yet, Ray's default ones (its issue detectors),
    which ``add_execution_callback`` would drop.
    """
    from ray.data._internal.execution import execution_callback as ec

    callbacks = context.get_config(ec.EXECUTION_CALLBACKS_CONFIG_KEY, None)
    if callbacks is not None:
        return list(callbacks)
    try:
        from ray.data._internal.execution.callbacks.insert_issue_detectors import (
            IssueDetectionExecutionCallback,
        )
    except ImportError:
        return []
    return [IssueDetectionExecutionCallback()]


def _set_instances(context: Any, callbacks: list[Any]) -> None:
    from ray.data._internal.execution import execution_callback as ec

    context.set_config(ec.EXECUTION_CALLBACKS_CONFIG_KEY, callbacks)


# ------------------------------------------------------------ task hooks (2, 3)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def submitted_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any, str | None]:
    """``on_task_submitted``'s task index, input bundle and Ray task id (2.54+, else None)."""
    task_id = _arg(args, kwargs, 2, "task_id")
    text: str | None = None
    if task_id is not None:
        try:
            text = None if task_id.is_nil() else task_id.hex()
        except Exception:
            text = None
    return int(_arg(args, kwargs, 0, "task_index")), _arg(args, kwargs, 1, "inputs"), text


def ray_task_id_of(op: Any, task_index: int) -> str | None:
    """Ray's id of an operator's data task, from its streaming generator (before 2.54
    ``on_task_submitted`` does not give it; the task is in ``op._data_tasks`` until
    after ``on_task_finished``)."""
    try:
        task = (getattr(op, "_data_tasks", None) or {}).get(task_index)
        if task is None:  # a hash-shuffle operator's shuffle task (2.50: by input, by index)
            for tasks in (getattr(op, "_shuffling_tasks", None) or {}).values():
                task = tasks.get(task_index)
                if task is not None:
                    break
        gen: Any = getattr(task, "_streaming_gen", None)
        if gen is None and task is not None:
            gen = task.get_waitable()  # a metadata task's object ref
        task_id = getattr(gen, "_generator_ref", gen).task_id()
        return None if task_id.is_nil() else str(task_id.hex())
    except Exception:
        return None


def output_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any]:
    """``on_task_output_generated``'s task index and output bundle."""
    return int(_arg(args, kwargs, 0, "task_index")), _arg(args, kwargs, 1, "output")


def finished_args(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, BaseException | None, int | None]:
    """``on_task_finished``'s task index, exception and the worker's USS peak (2.55+)."""
    error = _arg(args, kwargs, 1, "exception")
    stats = _arg(args, kwargs, 2, "task_exec_stats")
    return (
        int(_arg(args, kwargs, 0, "task_index")),
        error if isinstance(error, BaseException) else None,
        uss_of_finished(stats),
    )


def uss_of_finished(stats: Any) -> int | None:
    value = getattr(stats, "max_uss_bytes", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def uss_of_output(bundle: Any) -> int | None:
    """The largest USS peak on an output bundle's blocks (2.55+: task stats; before: block)."""
    best: int | None = None
    for meta in getattr(bundle, "metadata", None) or ():
        for holder in (getattr(meta, "task_exec_stats", None), getattr(meta, "exec_stats", None)):
            value = getattr(holder, "max_uss_bytes", None)
            if isinstance(value, int) and value > 0 and (best is None or value > best):
                best = value
    return best


def bundle_counts(bundle: Any) -> tuple[int, int, int]:
    """Blocks, rows and bytes of a ``RefBundle`` (0 where Ray Data does not know)."""
    if bundle is None:
        return 0, 0, 0
    try:
        blocks = len(bundle)
    except Exception:
        blocks = 0
    try:
        rows = int(bundle.num_rows() or 0)
    except Exception:
        rows = 0
    try:
        size = int(bundle.size_bytes() or 0)
    except Exception:
        size = 0
    return blocks, rows, size


# ------------------------------------------------------------ executor and operators


def dataset_id(executor: Any) -> str:
    return str(getattr(executor, "_dataset_id", None) or "dataset")


def data_context(executor: Any) -> Any:
    return getattr(executor, "_data_context", None)


def operators(executor: Any) -> list[Any]:
    """The executor's physical operators, in Ray Data's order (its operator ids' index)."""
    return list(getattr(executor, "_topology", None) or ())


def remote_args(op: Any) -> dict[str, Any]:
    args = getattr(op, "_ray_remote_args", None)
    return dict(args) if isinstance(args, dict) else {}


def op_metrics(op: Any) -> Any:
    """The metrics whose task hooks an operator calls. A hash-shuffle operator (groupby,
    join, keyed repartition) calls those of its shuffle tasks: ``op.metrics`` returns
    them from 2.55, but up to 2.53 they are ``op.shuffle_metrics`` and in 2.54
    ``op._shuffle_metrics`` (``op.metrics`` is then the base operator's, whose hooks it
    never calls)."""
    for name in ("shuffle_metrics", "_shuffle_metrics"):
        shuffle = getattr(op, name, None)
        if shuffle is not None and callable(getattr(shuffle, "on_task_submitted", None)):
            return shuffle
    try:
        return op.metrics
    except Exception:
        return None


def resources(executor: Any) -> tuple[Any, Any] | None:
    """The resource manager's (usage, limits), or None before it exists."""
    manager = getattr(executor, "_resource_manager", None)
    if manager is None:
        return None
    return manager.get_global_usage(), manager.get_global_limits()


# ------------------------------------------------------------ the transformer (4, 5)

_HOOK_LOCK = threading.Lock()


def install_start_hook(on_start: Callable[[Any], None]) -> None:
    """Run ``on_start(op)`` before every ``MapOperator.start`` of this process (once).

    ``on_start`` must not raise (it is the caller's guard); the operator
    starts as Ray Data would have started it either way.
    """
    from ray.data._internal.execution.operators.map_operator import MapOperator

    with _HOOK_LOCK:
        current = MapOperator.__dict__.get("start")
        if getattr(current, "__tracer_hook__", False):
            return
        original = current

        @functools.wraps(original)
        def start(self: Any, *args: Any, **kwargs: Any) -> Any:
            on_start(self)
            return original(self, *args, **kwargs)

        start.__tracer_hook__ = True  # type: ignore[attr-defined]
        MapOperator.start = start


def transformer_not_sent(op: Any) -> bool:
    """Whether a started map operator's transformer is still to be sent to its tasks.

    True for a task pool whose object-store copy is made lazily, on the first
    task (2.53+: a property over ``__map_transformer_ref``; 2.60: a
    ``cached_property``), and not made yet: it can still be traced after
    ``start``. Not for actor pools (their actors got it in ``start``) nor
    before 2.53 (``start`` puts it in the object store).
    """
    if type(op).__name__ == "ActorPoolMapOperator":
        return False
    lazy = getattr(type(op), "_map_transformer_ref", None)
    if isinstance(lazy, functools.cached_property):
        return "_map_transformer_ref" not in vars(op)
    if isinstance(lazy, property):
        return vars(op).get("_MapOperator__map_transformer_ref", 0) is None
    return False


def map_transformer(op: Any) -> Any:
    return getattr(op, "_map_transformer", None)


def is_map_operator(op: Any) -> bool:
    from ray.data._internal.execution.operators.map_operator import MapOperator

    return isinstance(op, MapOperator)


# ------------------------------------------------------------ all-to-all operators (6)


def bulk_fn(op: Any) -> Any:
    """An all-to-all operator's bulk function (what runs its whole exchange), or None."""
    try:
        from ray.data._internal.execution.operators.base_physical_operator import (
            AllToAllOperator,
        )
    except ImportError:
        return None
    if not isinstance(op, AllToAllOperator):
        return None
    fn = getattr(op, "_bulk_fn", None)
    return fn if callable(fn) else None


def set_bulk_fn(op: Any, fn: Any) -> None:
    op._bulk_fn = fn


def progress_bar_class() -> Any:
    """The class whose ``fetch_until_complete`` waits for a round of tasks, or None.

    The class that defines it, for every bar inherits it: ``BaseProgressBar`` (2.54+),
    ``AbstractProgressBar`` (2.52, 2.53: base of ``ProgressBar`` and of the rich
    ``SubProgressBar``), ``ProgressBar`` itself (2.50).
    """
    try:
        from ray.data._internal.progress.base_progress import BaseProgressBar

        return BaseProgressBar
    except ImportError:
        pass
    try:
        from ray.data._internal.progress_bar import ProgressBar
    except ImportError:
        return None
    for cls in ProgressBar.__mro__:
        if "fetch_until_complete" in vars(cls):
            return cls
    return None


def round_name(bar: Any) -> str:
    """Ray Data's name of the round a sub-progress bar waits for ("Shuffle Map").

    Ray 2.60 has a bar class per display: rich's and 2.50's say the name as their
    description; tqdm's (a terminal) says it drawn as a tree ("  *- Shuffle Map");
    the logging one (stdout not a terminal: logs, CI, batch jobs) says "" and keeps
    the name in ``_name``. The name alone, whichever.
    """
    name: Any = None
    with contextlib.suppress(Exception):
        name = bar.get_description()
    for attr in ("_name", "_desc"):
        if name:
            break
        name = getattr(bar, attr, None)
    text = str(name).strip().lstrip("*-│├─ ").strip() if name else ""
    return text or type(bar).__name__


def returned_refs(result: Any) -> list[Any]:
    """The object refs a task submission returned (none for a generator)."""
    import ray

    if isinstance(result, ray.ObjectRef):
        return [result]
    if isinstance(result, list) and result and isinstance(result[0], ray.ObjectRef):
        return result  # num_returns > 1: Ray's list of refs
    return []


def ref_task_id(ref: Any) -> str | None:
    """Ray's id (hex) of the task that returns ``ref``."""
    try:
        task_id = ref.task_id()
        return None if task_id.is_nil() else str(task_id.hex())
    except Exception:
        return None


def submit_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``RemoteFunction._remote(args, kwargs, serialized_runtime_env_info, **options)``'s
    arguments of the task, and its options."""
    call_args = kwargs.get("args", args[0] if args else None) or ()
    call_kwargs = kwargs.get("kwargs", args[1] if len(args) > 1 else None) or {}
    options = {
        k: v for k, v in kwargs.items()
        if k not in ("args", "kwargs", "serialized_runtime_env_info")
    }
    return [*call_args, *call_kwargs.values()], options


def ref_keys(refs: list[Any]) -> set[int]:
    """Keys of objects (their ids' hashes) that, unlike their refs, do not keep them alive.

    Per ref in C (~60 ns): a pull-based shuffle of N blocks passes N^2 refs.
    """
    return set(map(hash, refs))


def count_known(values: list[Any], keys: set[int]) -> int:
    """How many of ``values`` are refs of objects among ``keys`` (:func:`ref_keys`)."""
    import ray

    refs = [v for v in values if isinstance(v, ray.ObjectRef)]
    return sum(map(keys.__contains__, map(hash, refs)))


def block_refs(bundles: Any) -> list[Any]:
    """The block refs of a list of ``RefBundle`` (an all-to-all operator's input)."""
    refs: list[Any] = []
    for bundle in bundles or ():
        for entry in getattr(bundle, "blocks", None) or ():
            ref = getattr(entry, "ref", None)
            if ref is None and isinstance(entry, tuple) and entry:
                ref = entry[0]  # (ref, metadata) pairs before 2.60
            if ref is not None:
                refs.append(ref)
    return refs


def task_request(fn: Any, options: dict[str, Any]) -> ResourceRequest:
    """A task's request: its options over its remote function's, Ray's default 1 CPU."""
    merged = {**(getattr(fn, "_default_options", None) or {}), **options}
    cpus = merged.get("num_cpus")
    gpus = merged.get("num_gpus")
    memory = merged.get("memory")
    try:
        return ResourceRequest(
            num_cpus=1.0 if cpus is None else float(cpus),
            num_gpus=None if gpus is None else float(gpus),
            memory_bytes=None if memory is None else int(memory),
        )
    except (TypeError, ValueError):
        return ResourceRequest()


def function_name(fn: Any) -> str:
    """A remote function's name as its code says it: ``ShuffleTaskSpec.map``."""
    function = getattr(fn, "_function", None)
    name = getattr(function, "__qualname__", None) or getattr(fn, "_function_name", None)
    return str(name).replace("<locals>.", "") if name else "?"


def ready(refs: list[Any]) -> list[Any]:
    """Of ``refs``, those ready now (no wait, nothing fetched)."""
    import ray

    if not refs:
        return []
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    return list(done)


def task_error(ref: Any) -> BaseException | None:
    """The error a finished task's result is, if it is one (``ref``: a small result)."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.GetTimeoutError:
        return None
    except Exception as exc:
        return exc
    return None


def result_metadata(result: Any) -> tuple[int | None, int | None, str | None] | None:
    """Rows, bytes and node of a task's output from Ray Data's block metadata, or None."""
    meta = getattr(result, "metadata", result)
    if not hasattr(meta, "num_rows") or not hasattr(meta, "size_bytes"):
        return None
    rows = meta.num_rows if isinstance(meta.num_rows, int) else None
    size = meta.size_bytes if isinstance(meta.size_bytes, int) else None
    node = getattr(getattr(meta, "exec_stats", None), "node_id", None)
    return rows, size, node if isinstance(node, str) else None


# ------------------------------------------------------------ actor pools (7)

#: The attribute of a traced map operator: when it started (the writer's clock, ns). Here,
#: not in .actors: the callback sets it at every level, and at level 0 it must load none
#: of the tracer's writing modules (tests/ray/test_worker_imports.py).
STARTED_ATTR = "_tracer_started_ns"


#: What the pool calls the method that adds an actor created: 2.60's, then 2.50's name.
ADD_PENDING_ACTOR = ("_add_pending_actor", "add_pending_actor")


def add_pending_name(pool: Any) -> str | None:
    """The name of the pool's method that adds an actor created, or None."""
    return next((n for n in ADD_PENDING_ACTOR if callable(getattr(pool, n, None))), None)


def actor_pool(op: Any) -> Any:
    """An actor-pool operator's pool, if it has all that :mod:`.actors` reads; else None."""
    pool = getattr(op, "_actor_pool", None)
    if pool is None:
        return None
    if add_pending_name(pool) is None or not callable(getattr(pool, "pending_to_running", None)):
        return None
    if not isinstance(getattr(pool, "_pending_actors", None), dict) or not isinstance(
        getattr(pool, "_running_actors", None), dict
    ):
        return None
    return pool


def pending_actors(pool: Any) -> list[tuple[Any, Any]]:
    """The pool's actors still starting: (ready ref, actor handle)."""
    return list(pool._pending_actors.items())


def running_actors(pool: Any) -> list[Any]:
    """The pool's actors that are ready."""
    return list(pool._running_actors)


def pending_actor_of(pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The actor ``pending_to_running``'s ready ref stands for, while still pending."""
    try:
        return pool._pending_actors.get(ready_ref_arg(args, kwargs))
    except Exception:
        return None


def is_pending(pool: Any, ready_ref: Any) -> bool:
    return ready_ref in pool._pending_actors


def added_actor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``_add_pending_actor``'s (actor, ready_ref)."""
    return _arg(args, kwargs, 0, "actor"), _arg(args, kwargs, 1, "ready_ref")


def ready_ref_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``pending_to_running``'s ready ref."""
    return _arg(args, kwargs, 0, "ready_ref")


def actor_id(actor: Any) -> str | None:
    """Ray's id of an actor handle (hex), or None."""
    try:
        return str(actor._actor_id.hex())
    except Exception:
        return None


def actor_node(pool: Any, actor: Any) -> str | None:
    """The node a ready actor of the pool runs on (Ray's node id), or None."""
    try:
        location = pool._running_actors[actor].actor_location
    except Exception:
        return None
    return str(location) if location else None


# ------------------------------------------------------------ queues, backpressure (8)


def op_states(executor: Any) -> dict[Any, Any] | None:
    """The executor's operator -> ``OpState`` (its topology), or None."""
    topology = getattr(executor, "_topology", None)
    return topology if isinstance(topology, dict) else None


def queued_blocks(state: Any) -> int | None:
    """Blocks queued at an operator's input (its ``OpState``'s: 2.60's name, then 2.50's),
    or None where not known."""
    for name in ("total_enqueued_input_blocks", "total_enqueued_input_bundles"):
        count = getattr(state, name, None)
        if callable(count):
            return int(count())
    return None


def backpressure(op: Any) -> tuple[str | None, str | None] | None:
    """The policies holding back the operator's task submissions and its outputs (each
    None where not held back; "" where Ray Data names none), or None where not known."""
    tasks = getattr(op, "_in_task_submission_backpressure", None)
    outputs = getattr(op, "_in_task_output_backpressure", None)
    if tasks is None and outputs is None:
        return None
    return (
        str(getattr(op, "_task_submission_backpressure_policy", None) or "") if tasks else None,
        str(getattr(op, "_task_output_backpressure_policy", None) or "") if outputs else None,
    )
