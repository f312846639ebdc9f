"""The names in a runner trace: the contract between writer, queries and users.

Queries (``tracer.query``), tests and user SQL rely on these names; change
them only together with those. Annotation names appear in trace_processor
as ``debug.<name>`` (nested: ``debug.resource_request.num_cpus``).
"""

from __future__ import annotations

# Slice categories: every slice carries exactly one.
#: The dispatch loop's slices, and Ray's own events of the tasks (Ray's
#: scheduling states, its phases in the worker: the system's view of a task,
#: not the runner's nor the tracer's measurement), each on tracks of their own.
CAT_SCHEDULER = "scheduler"
CAT_TASK = "task"
CAT_STAGE = "stage"
CAT_EXECUTION = "execution"
#: Ray's own events of a task (read from Ray's task events, tracer.ray.ray_events).
CAT_RAY = CAT_SCHEDULER
#: An attempt of a task that failed and that Ray ran again (SLICE_FAILED_ATTEMPT_PREFIX):
#: not an execution (nothing of it was measured, and the task's execution is its
#: retry's), so the queries' executions leave it out.
CAT_ATTEMPT = "attempt"

# Tracks. Every track of a run is a plain track (no process or thread
# tracks: the Perfetto UI would append their pids and tids, synthetic for
# nodes and workers, to their names), under one root per run, in this order
# (explicit child_ordering): the Scheduler (the dispatch loop, then its
# counters), Ray tasks, Stages, then the nodes in the order they were seen;
# each node holds its memory counters (on one shared y axis) and then one
# track per worker process, named by its real pid, which holds the worker's
# executions and, under it, Ray's phases and the worker's memory counters.
#: The run's root: "Run <execution_id>".
RUN_TRACK_PREFIX = "Run"
#: "Scheduler (<runner name>)" (a group: the dispatch loop and its counters).
SCHEDULER_PROCESS = "Scheduler"
DISPATCH_LOOP_THREAD = "Dispatch loop"
TASKS_TRACK = "Ray tasks"
TASK_LANE = "tasks"
#: Beside the task lanes, after them (one name: merged into one UI track, as they are):
#: Ray's scheduling states of the tasks (STATE_*), each task's nested in a slice named
#: ``RAY_STATES_PREFIX + stage`` (args task_id, attempt; worker_pid on a task with no
#: execution, where Ray's events name its worker) spanning its 'dispatched' slice.
#: (Traces of tracer before 2026-12-07 have a track of this name under each task lane,
#: holding the states of that lane's tasks, the first of each naming its task; the query
#: layer reads both.)
RAY_STATES_TRACK = "Ray states"
RAY_STATES_PREFIX = "ray states "
STAGES_TRACK = "Stages"
#: Under a stage's track, for an engine whose stage runs on a pool of actors it starts
#: (Ray Data's actor pools): each actor from its creation until the engine saw it ready
#: (its ``__init__`` done: a model loaded), a slice ``SLICE_ACTOR_STARTING`` (category
#: stage, args stage_id, stage, actor_id; on its END node_id where it started, status
#: when it never became ready), on lanes of this one name (the UI merges them) so that
#: actors starting together never break nesting. Declared at the stage's first actor.
ACTOR_START_TRACK = "actors starting"
SLICE_ACTOR_STARTING = "actor starting"
#: "Node <index> (<first 8 characters of the Ray node id>)", under the run's root.
NODE_PROCESS_PREFIX = "Node"
#: "worker <pid>", under its node: the worker process's real pid.
WORKER_THREAD_PREFIX = "worker"
#: The y_axis_share_key of a node's memory counters (requested, used): one scale.
NODE_MEMORY_AXIS = "node memory"

#: Under the dispatch loop's track: the driver's Python garbage collections that
#: paused it (tracer.ray.driver_gc), each a slice named ``SLICE_GC_PREFIX +
#: generation`` ("Python GC (generation 2)": a full one), args ARG_GC_*. A
#: collection holds the GIL: the loop stood still meanwhile, whichever thread
#: set it off. Declared at the first such pause.
DRIVER_GC_TRACK = "Python GC (driver)"
SLICE_GC_PREFIX = "Python GC (generation "

#: Under a worker's track: Ray's phases of each task the worker ran (a slice
#: named ``RAY_TASK_PREFIX + Ray's task name`` with the phases nested in it).
#: A track of its own, not nested in the execution slice: Ray deserializes the
#: arguments before the measured execution starts and stores the outputs after
#: it ends. Tasks of a threaded actor that overlap go on lanes of this name.
RAY_PHASES_TRACK = "Ray phases"

COUNTER_INFLIGHT = "tasks in flight"
COUNTER_AVAILABLE_CPUS = "available CPUs"
COUNTER_AVAILABLE_GPUS = "available GPUs"
COUNTER_AVAILABLE_MEMORY = "available memory"
#: Object-store memory the producer's scheduler has left (Ray Data's resource manager).
COUNTER_AVAILABLE_OBJECT_STORE = "available object store memory"
#: Object-store memory in use by the run's blocks, as the producer's scheduler counts it.
COUNTER_OBJECT_STORE_USED = "object store memory used"
#: Tasks of one stage in flight, under the Scheduler process; ``stage`` is the
#: stage's track name ("1: MapBatches(f)"). COUNTER_INFLIGHT is all stages'.
COUNTER_STAGE_INFLIGHT = "tasks in flight ({stage})"
#: Blocks queued at one stage's input, waiting for a task of it (an engine whose
#: scheduler queues its stages' inputs: Ray Data's "Queued blocks"), sampled at its
#: scheduling steps, under the Scheduler after the stage's tasks in flight; drawn from
#: the stage's first queued block on.
COUNTER_STAGE_QUEUED = "queued blocks ({stage})"
#: 1 while the engine holds a stage back (Ray Data's backpressure: its task submissions,
#: or its outputs), else 0; after the stage's queued blocks, from its first backpressure.
#: The reasons (the engine's policies) are on INSTANT_BACKPRESSURED marks.
COUNTER_STAGE_BACKPRESSURED = "backpressured ({stage})"

# Memory counters (unit bytes, stored in KiB with unit_multiplier 1024), each
# on a packet sequence of its own (see tracer.ray.timeline.memory).
#: Under a worker's track: heap of the task running there (level 2, memray's
#: 10 ms snapshots; each task's heap counts from its start, so it is 0 between tasks).
COUNTER_WORKER_HEAP = "heap"
#: Under a worker's track: the worker process's RSS (level 1: at each task's
#: start and end; level 2: also memray's 10 ms snapshots).
COUNTER_WORKER_RSS = "RSS"
#: Under a node's track: memory requested by the tasks running there.
COUNTER_NODE_MEMORY_REQUESTED = "memory requested"
#: Under a node's track: actual peak memory (ARG_MEMORY_PEAK) of the tasks
#: running there, summed: each task counts its peak from its start to its end.
COUNTER_NODE_MEMORY_USED = "memory used (task peaks)"

# Dispatch-loop slices (category scheduler).
SLICE_EXECUTION = "execution"
SLICE_WAVE = "wave"
SLICE_PLAN_POLLING = "plan polling"
SLICE_BATCHING = "batching"
SLICE_DISPATCHING = "dispatching"
SLICE_AWAITING = "awaiting"
SLICE_NOOP_TASK = "no-op task"

# Dispatch-loop instants (category scheduler).
INSTANT_NOTHING_READY = "plan: nothing ready"
INSTANT_MATERIALIZED = "plan: result materialised"
INSTANT_TASK_ADDED = "plan: task added to batch"
INSTANT_DISPATCH_TASK = "dispatch task"
INSTANT_DISPATCH_ACTOR_TASK = "dispatch actor task"
#: A stage was held back by a reason not seen for it before (args stage_id, stage, and
#: ARG_BACKPRESSURE_TASKS / ARG_BACKPRESSURE_OUTPUTS: the engine's policy holding back
#: its task submissions / its outputs); COUNTER_STAGE_BACKPRESSURED says when.
INSTANT_BACKPRESSURED = "backpressured"
#: A task's measurements will never arrive (args: task_id, reason).
INSTANT_METRICS_LOST = "task measurements lost"
#: On the dispatch loop at the run's end, once Ray's events were read (after the run
#: returned: they come late): ``ray_events_missing``, ``ray_events_dropped``.
INSTANT_RAY_EVENTS = "Ray's events read"
#: The metrics actor stopped answering; the tracer stopped calling it (args: reason).
INSTANT_METRICS_ACTOR_LOST = "metrics actor lost"

# Task slices (category task): the outer slice is named after the stage.
SLICE_DISPATCHED = "dispatched"

# Ray's events (category CAT_RAY, which is CAT_SCHEDULER).
#: On the worker's RAY_PHASES_TRACK: Ray's whole handling of one task attempt
#: in its worker ("ray task f"), args task_id, ray_attempt (Ray's task id is on the
#: execution beside it).
RAY_TASK_PREFIX = "ray task "
#: Ray's phases, nested in it (Ray's profile events task:deserialize_arguments,
#: task:execute, task:store_outputs).
PHASE_DESERIALIZE = "deserialize arguments"
PHASE_EXECUTE = "execute"
PHASE_STORE_OUTPUTS = "store outputs"
#: Ray's scheduling states, on a RAY_STATES_TRACK lane in the task's
#: RAY_STATES_PREFIX slice (its 'dispatched' span), each from the time Ray entered it
#: to the next state (the last, FINISHED or FAILED, until the runner received the task; a
#: state Ray timed after that is left out). Names are Ray's TaskStatus:
STATE_PENDING_ARGS = "PENDING_ARGS_AVAIL"  # submitted; its arguments are not all ready
STATE_PENDING_NODE = "PENDING_NODE_ASSIGNMENT"  # waiting for a worker lease
STATE_SUBMITTED = "SUBMITTED_TO_WORKER"  # leased: pushed to the worker, which starts it
STATE_RUNNING = "RUNNING"  # in the worker: arguments, the body, storing outputs
STATE_FINISHED = "FINISHED"  # the owner (driver) has the reply: until the loop sees it
STATE_FAILED = "FAILED"

#: On a stage's track, nested in the stage's slice (category stage, args
#: stage_id, task_id): the moment a task of the stage was created, where the
#: arrow to the task's first execution starts.
INSTANT_TASK_LAUNCHED = "task launched"

# Instants on a worker or node (category execution).
INSTANT_TASK_FAILED = "task failed"
INSTANT_TASK_CANCELLED = "task cancelled"
#: On a worker's track (category attempt): an attempt that failed there and that Ray
#: ran again (its worker OOM-killed or crashed; retry_exceptions), from when Ray's
#: events say it ran to its failure, named "failed attempt: <stage>", with the args of
#: its "task failed" mark (ARG_RETRIED). From Ray's task events: without them (Ray's
#: events off, or dropped) only the task's ARG_RAY_ATTEMPTS says it was retried.
SLICE_FAILED_ATTEMPT_PREFIX = "failed attempt: "

# Values of ARG_STATUS, on task slices (END) and execution slices. A task
# received with its result has no status.
STATUS_FAILED = "failed"
#: Never ran: its input is a failed task's result (ARG_UPSTREAM_TASK_ID).
STATUS_FAILED_UPSTREAM = "failed upstream"
#: Cancelled (ray.cancel): on the task; on its execution if it was running.
STATUS_CANCELLED = "cancelled"
#: Still in flight when the trace was closed.
STATUS_UNFINISHED = "unfinished"
#: Created again under the same id (the runner retried it itself).
STATUS_SUPERSEDED = "superseded"
#: On an ``actor starting`` slice: the engine removed the actor before it was ready
#: (its pool scaled down, or the execution ended).
STATUS_RELEASED = "released"

# Annotation names.
#: The wave's number, on the BEGIN of its slice.
ARG_WAVE = "wave"
# Counts in a wave's args (the END of its slice).
ARG_TASKS_ADDED = "tasks_added"
ARG_TASKS_DISPATCHED = "tasks_dispatched"
#: Tasks that ended during the wave (producers whose loop reports it: Ray Data).
ARG_TASKS_FINISHED = "tasks_finished"
ARG_ACTOR_TASKS_DISPATCHED = "actor_tasks_dispatched"
ARG_TASK_ID = "task_id"
ARG_STAGE_ID = "stage_id"
ARG_STAGE = "stage"
ARG_INSTRUCTIONS = "instructions"
ARG_RESOURCE_REQUEST = "resource_request"
ARG_RAY_TASK_ID = "ray_task_id"
ARG_ASSIGNED_RESOURCES = "assigned_resources"
ARG_WORKER_PID = "worker_pid"
ARG_NODE_ID = "node_id"
ARG_ERROR_TYPE = "error_type"
ARG_ERROR = "error"
ARG_STATUS = "status"
ARG_UPSTREAM_TASK_ID = "upstream_task_id"
#: On a task slice: the runner's attempt (it created the task id again), from 1.
ARG_ATTEMPT = "attempt"
#: On an execution slice: Ray's attempt number of that execution (Ray retried
#: the task: max_retries after a crashed worker, retry_exceptions); written
#: only when > 0.
ARG_RAY_ATTEMPT = "ray_attempt"
#: On an execution slice whose worker started it before the driver recorded its
#: task's launch (Ray Data records a launch once Ray's submit has returned; a
#: node's clock behind the driver's): by how many ns. The slice is drawn from the
#: launch, so that the stage's arrow can reach it (trace_processor draws no arrow
#: that ends before it starts).
ARG_STARTED_BEFORE_LAUNCH = "started_before_launch_ns"
#: On an ``actor starting`` slice: Ray's actor id (hex).
ARG_ACTOR_ID = "actor_id"
#: On a slice drawn from the run's start though it began before (an actor its engine
#: created as its operator started, before the run's trace was opened): by how many ns.
ARG_BEGAN_BEFORE_RUN = "began_before_run_ns"
#: On a task slice (END) that Ray retried: how many attempts Ray made, as far
#: as the driver knows (the last attempt's number + 1), and how many of those
#: left no measurement (a crashed or killed worker, a lost node; an attempt
#: that raised, unless the execution has a metrics actor to report it).
ARG_RAY_ATTEMPTS = "ray_attempts"
ARG_UNMEASURED_ATTEMPTS = "unmeasured_attempts"
#: On the execution slice (END, at close): tasks whose measurements were lost.
ARG_LOST_MEASUREMENTS = "lost_measurements"
#: On the execution slice (END), where the channel that carries the tasks' measurements
#: stopped during the run (Ray Data's metrics actor failed: killed by Ray's OOM killer,
#: say): why. Measurements sent after it are lost (counted in ARG_LOST_MEASUREMENTS); a
#: ``measurements stopped`` instant on the dispatch loop says when.
ARG_MEASUREMENTS_STOPPED = "measurements_stopped"
INSTANT_MEASUREMENTS_STOPPED = "measurements stopped"
#: On a task slice (END), ``true``: the runner reported the task received
#: (``task_received_as_ready``) before it had finished. The slice ends where it
#: was received; the tracer did not wait for the task (one warning per run) and
#: drew its execution once it finished, so the execution ends after the slice
#: (or, not finished by the close, a ``task measurements lost`` instant says so).
ARG_RECEIVED_UNFINISHED = "received_unfinished"
#: On a task slice (END), what the task read and wrote, where the engine counts
#: it (Ray Data): blocks, rows and bytes in and out.
ARG_BLOCKS_IN = "blocks_in"
ARG_ROWS_IN = "rows_in"
ARG_BYTES_IN = "bytes_in"
ARG_BLOCKS_OUT = "blocks_out"
ARG_ROWS_OUT = "rows_out"
ARG_BYTES_OUT = "bytes_out"
#: On a task slice (BEGIN), where one stage runs several Ray functions (Ray Data's
#: all-to-all operators: ``ShuffleTaskSpec.map``, ``ShuffleTaskSpec.reduce``,
#: ``_sample_block``...): the one this task runs.
ARG_RAY_FUNCTION = "ray_function"
#: On an ``awaiting`` slice of the loop (Ray Data's all-to-all operators): the round
#: of tasks waited for (Ray Data's name of it: "Shuffle Map", "Shuffle Reduce",
#: "Sort Sample", "Split Repartition") and how many tasks (ARG_TASKS).
ARG_WAITING_FOR = "waiting_for"
ARG_TASKS = "tasks"
ARG_REASON = "reason"
ARG_BACKPRESSURE_TASKS = "backpressure_tasks"
ARG_BACKPRESSURE_OUTPUTS = "backpressure_outputs"
#: On the ``INSTANT_RAY_EVENTS`` instant (at the run's end), when Ray's events
#: were read: how many executions got no Ray events (never arrived within the close's
#: budget, or dropped by Ray's caps), and how many events Ray said it dropped
#: for the run's job (``RAY_task_events_max_num_task_in_gcs`` and others).
ARG_RAY_EVENTS_MISSING = "ray_events_missing"
ARG_RAY_EVENTS_DROPPED = "ray_events_dropped"
#: On the same instant: where they were read last: ``gcs`` (the GCS's task events),
#: ``dashboard`` (the dashboard head, where Ray sends them with
#: ``RAY_enable_task_events_to_dashboard_head``), ``all`` (every event Ray holds, as
#: ``ray.timeline()`` reads them: the fallback), ``none`` (no read succeeded).
ARG_RAY_EVENTS_SOURCE = "ray_events_source"
#: On the same instant: executions that were to be drawn from Ray's events (level 1
#: without a return channel) and were not, their events never having come.
ARG_EXECUTIONS_MISSING = "executions_missing"

# The driver's Python GC. On a GC slice: what the collection found, and the
# thread whose allocation set it off.
ARG_GC_GENERATION = "generation"
ARG_GC_COLLECTED = "collected"
ARG_GC_UNCOLLECTABLE = "uncollectable"
ARG_GC_THREAD = "thread"
#: On the run's ``execution`` slice (END): every collection of the driver's
#: Python GC while the run was traced, however short, their time in all, the
#: longest, and long pauses not drawn (more than tracer.ray.driver_gc.MAX_KEPT
#: between two flushes).
ARG_DRIVER_GC_COLLECTIONS = "driver_gc_collections"
ARG_DRIVER_GC_NS = "driver_gc_ns"
ARG_DRIVER_GC_LONGEST_NS = "driver_gc_longest_ns"
ARG_DRIVER_GC_DROPPED = "driver_gc_dropped"

# Memory annotations (bytes). On execution slices:
#: What the task asked Ray for (``memory=``); 0 means no request. On an
#: execution whose resources Ray reported, what Ray reserved for it.
ARG_MEMORY_REQUESTED = "memory_requested"
#: On an execution Ray reserved another memory for than the runner's
#: ``ResourceRequest`` said: the runner's figure (memory_requested is Ray's).
ARG_MEMORY_REQUESTED_BY_RUNNER = "memory_requested_by_runner"
#: On the run's ``execution`` slice: how many executions had such a mismatch.
ARG_MEMORY_REQUEST_MISMATCHES = "memory_request_mismatches"
#: The task's actual peak: at level 2 memray's heap high-water mark of the task
#: (ARG_HEAP_PEAK); at level 1, or when memray was unavailable, the worker
#: process's private peak RSS while the task ran, or the engine's own per-task
#: USS peak where it measures one and it is larger (ARG_USS_PEAK: Ray Data's,
#: sampled once a second); both include the worker's own baseline.
ARG_MEMORY_PEAK = "memory_peak"
#: ``true`` when memory_peak > memory_requested > 0; absent otherwise. A task
#: with no request (0) is never "over": find those with memory_requested = 0.
ARG_OVER_REQUEST = "over_request"
ARG_HEAP_PEAK = "heap_peak"  # level 2: memray's heap high-water mark
ARG_ALLOCATIONS = "allocations"  # level 2: allocations live at that peak
ARG_HEAP_RETAINED = "heap_retained"  # level 2: bytes still allocated at the task's end
# level 2 with memray_all_allocations=True: every allocation of the task, summed.
ARG_TOTAL_ALLOCATED = "total_allocated"
ARG_ALLOCATION_COUNT = "allocation_count"
ARG_RSS_PEAK = "rss_peak"  # level 2: worker RSS peak (level 1: it is memory_peak)
#: The worker process's peak USS (unique set size) while the task ran, as the
#: engine itself measured it (Ray Data's per-task estimate, sampled once a
#: second: a short task's is mostly the worker's baseline). Without a heap peak
#: (level 1) memory_peak is the larger of it and the private RSS peak: like RSS
#: it includes the worker's own baseline, but not the pages it shares.
ARG_USS_PEAK = "uss_peak"
#: Level 2, only when memray did not measure the task alone with the worker's one
#: tracker: "unavailable" (level-1 figures; ARG_MEMRAY_REASON says why), "shared"
#: (other tasks of the same worker process ran meanwhile and are in its heap
#: figures, which are then upper bounds of its own) or "per_task" (MEMRAY_PER_TASK).
ARG_MEMRAY = "memray"
ARG_MEMRAY_REASON = "memray_reason"
#: ARG_MEMRAY of a task measured by a memray tracker of its own, the slower way
#: (~20-90 ms more a task): the worker's one tracker could not be read (no C
#: reader built, a memray it does not know; ARG_MEMRAY_REASON says why), or
#: TRACER_MEMRAY_PER_TASK asked for it. Its figures are as good.
MEMRAY_PER_TASK = "per_task"
#: On the run's ``execution`` slice: how many executions were measured that way,
#: and the first one's reason.
ARG_MEMRAY_PER_TASK = "memray_per_task"
ARG_MEMRAY_PER_TASK_REASON = "memray_per_task_reason"
#: On a task killed by Ray's OOM killer: the worker's memory use Ray reported. When
#: Ray killed several workers at once (ARG_OOM_KILLED_WORKERS) its report does not say
#: which ran the task: the least of theirs, a lower bound of the task's worker's.
ARG_MEMORY_AT_KILL = "memory_used_at_kill"
#: On a task killed by Ray's OOM killer together with other task workers: {pid: memory
#: use at the kill} of each task worker Ray's report names (actors' workers, which it may
#: name too, run no task); the task ran in one of them (its ARG_WORKER_PID is then
#: absent, and its "task failed" mark is on the node's track).
ARG_OOM_KILLED_WORKERS = "oom_killed_workers"
#: On the "task failed" mark of a task Ray's OOM killer killed: the processes using the
#: most memory on its node at the kill, as Ray's report lists them (its top 10), each
#: {pid, memory (bytes), command}: a Ray worker's command names the task or actor it
#: ran ("ray::MapBatches(hog)"), so the task that took the memory shows even where Ray
#: killed another one (its own measurements, unfinished, never came).
ARG_OOM_TOP_MEMORY_USERS = "oom_top_memory_users"
#: On a "task failed" mark, ``true``: the attempt failed and Ray ran the task again (the
#: mark's ARG_RAY_ATTEMPT says which attempt; the task's slice ends as its last attempt
#: did). An OOM kill's mark has ARG_MEMORY_AT_KILL and ARG_OOM_TOP_MEMORY_USERS, and the
#: queries count the task as killed (its memory_at_kill is its largest kill's).
ARG_RETRIED = "retried"
#: On stage slices (END), where the engine queues its stages' inputs (Ray Data): the most
#: blocks queued at the stage's input at once, and how long the engine held the stage
#: back in all while blocks were queued there (its COUNTER_STAGE_BACKPRESSURED at 1, with
#: nothing queued, is a stage idle rather than delayed), sampled at its scheduling steps.
ARG_QUEUED_BLOCKS_MAX = "queued_blocks_max"
ARG_BACKPRESSURED_NS = "backpressured_ns"
#: On stage slices, with memory_requested / memory_peak as {min, p50, max}.
ARG_TASKS_OVER_REQUEST = "tasks_over_request"
