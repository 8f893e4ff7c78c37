"""Every piece of state this package keeps for the whole process, and why it is not an object's.

State belongs to an object (a compiled function's capture manager, a key, a graph) unless what
it describes is the process's own: a lock every caller must share, a fact of the host or of a
library that keeps its own process-wide cache, a thread or process the whole process owns, or a
memo of an answer that depends on nothing else. Each module-level container or instance that
changes while the process runs is listed here, by its module and name, with the reason;
``tests/test_layers.py`` fails for one that is not (write the state on an object, or add it here
with its reason).
"""

from __future__ import annotations

PROCESS_STATE: dict[str, str] = {
    # Locks every compiled function must share.
    "capture.manager.GLOBAL_CAPTURE_LOCK": "a capture in capture_error_mode='global' must not "
    "overlap another compiled function's capture: the allocator and the recorder are the process's",
    "runtime.base.RUNTIME_LOCKS": "one lock per device type: captures sharing a pool share bytes, "
    "whichever compiled function they belong to",
    "capture.pools.KEPT_POOLS": "a use_graph_pool handle may outlive every graph compiled with it "
    "and be given to the next: its hold lives as long as the process",
    # What stats() reports: the process's compiled graphs.
    "capture.stats.LIVE_GRAPHS": "every live capture manager, for npugraph_ex.stats() (weak: a "
    "graph's life is its manager's)",
    "capture.stats.GRAPH_NUMBERS": "a number names one graph for the life of the process "
    "(messages said once per graph), never reused after a Dynamo reset",
    "capture.deadlock.EXCHANGES": "the key of each collective-order check through the process "
    "group's store: every rank counts its checks the same way",
    "fixed_views.FIXED_VIEWS": "one tensor object per place every capture binds there (weak)",
    # Threads and processes the process owns.
    "kernels.processes.PROCESSES": "compile processes are bounded per process "
    "(background_compiles_in_flight), not per graph; killed at the process's exit",
    "runtime.cpu.workers.WORKERS": "one worker thread per stream tag, shared by every graph",
    "runtime.cpu.workers.WORKERS_LOCK": "guards WORKERS",
    "runtime.cpu.forked.FORKED_CHILDREN": "whether the process ran OpenMP's thread team before a "
    "fork: a fact of the process, read in its forked children",
    "scope.router.ACTIVE": "the stream router of the device replay running now (a stack: replays "
    "nest inside a capture's warm-up)",
    "scope.ops.active": "per thread, the scopes entered and not yet exited (a thread-local)",
    # Facts of the host and of libraries with process-wide caches.
    "runtime.cpu.host_answers.HOST_ANSWERS": "the host's vector-instruction answers and compiler "
    "header, which Inductor's loader would otherwise find out once per process",
    "runtime.cpu.probes.MEASURED": "what the host's kernels are good at, measured once per "
    "process and thread count (a compile process takes the serving process's)",
    "runtime.cpu.platform.LINEAR_ROW_COUNTS": "oneDNN keeps code per row count for the process's "
    "life: the count it was given bounds that memory",
    "runtime.cpu.constants.SHARED": "tiny constants with the same bytes are shared by every "
    "capture of the process",
    "scope.ops.LIBRARIES": "torch.library registrations are the process's; kept alive here",
    # Memos of answers that depend on nothing else.
    "runtime.cpu.out_check.VERDICTS": "whether an out= overload writes in place, per argument "
    "layout: a fact of the kernel (capped)",
    "runtime.cpu.out_check.PATTERN_VERDICTS": "the same per layout pattern (capped)",
    "runtime.cpu.bindings.RESOLVED": "the callable chosen for a kernel and argument types",
    "runtime.cpu.steps.COMPUTED_BY": "the op each compute-and-copy function computes; the "
    "functions live as long as the process anyway",
    "runtime.cpu.program.NO_GLOBALS": "the generated replay functions' globals: empty, never "
    "written",
    # Said once per process.
    "debug.once.SEEN": "the keys of messages logged once per process",
    "debug.once.SEEN_LOCK": "guards SEEN",
    "config._logged_once": "the option messages logged once per process (below debug.once's layer)",
    # Within one compile, read by Dynamo's hooks that take no argument of ours.
    "model_floats.ADDED": "the symbols asked to be specialised in the compile under way",
    # The benchmark harness.
    "bench.inductor_async.REFUSED": "the graphs Inductor's async mode refused in this bench run",
}
