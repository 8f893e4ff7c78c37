"""What Inductor finds out about the host on a process's first kernel load, answered by the
compile process instead of found out again.

Loading kernels compiled by Inductor's C++ wrapper asks two questions once per process, both slow
the first time, both asked by the compile process of the same host moments before:

- which vector instructions this host's compiler builds (``cpu_vec_isa.valid_vec_isa_list``):
  a dozen compiler runs and about 60,000 Python calls (1 s with Inductor's cache on disk warm,
  5 s cold);
- where the wrapper's precompiled header is (``codecache._precompile_header``): the header run
  through the preprocessor and hashed, a compiler run of about 150 ms, to find the ``.gch`` file
  the compile process built.

Done in the serving thread either stalls a call, done in a thread beside it every call convoys
behind it. So the compile process records each answer (``HostAnswers.recording``) and sends
them with the kernels; the serving process takes them (``HostAnswers.take``) and its first load
costs milliseconds:

    compile process:  VecISA.check_build(code) -> True   recorded under (ISA, flags, code)
                      _precompile_header(h, cmd, **opts) -> path   recorded under its arguments
    serving process:  valid_vec_isa_list() with check_build answering from the record;
                      _precompile_header answering from it where the file is still there
                      (a question the record lacks is asked as it would be)

Only answers the host gave are taken, so the list a process keeps is the one it would have
probed; a process that probed already is left as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

ProbeKey = tuple[str, str, str]
"""An ISA's class name, its compiler flags at the probe, and a digest of the probed code."""


def probe_key(isa: Any, code: str) -> ProbeKey:
    flags = str(getattr(isa, "_arch_flags", ""))
    return type(isa).__name__, flags, hashlib.sha256(code.encode()).hexdigest()[:16]


class ProbeRecord:
    """The vector-instruction probes' answers this process gave (a compile process), and the
    taking of another process's answers (a serving process)."""

    def __init__(self) -> None:
        self.answers: dict[ProbeKey, bool] = {}
        self.lock = threading.Lock()
        self.recording = False

    @contextlib.contextmanager
    def recording_answers(self) -> Iterator[dict[ProbeKey, bool]]:
        """Within the block, every probe's answer is recorded; the dict yielded holds every
        answer recorded in this process so far once the block ends."""
        from torch._inductor.cpu_vec_isa import VecISA

        with self.lock:
            if not self.recording:
                self.recording = True
                VecISA.check_build = self.recorded(VecISA.check_build)
        found: dict[ProbeKey, bool] = {}
        try:
            yield found
        finally:
            found.update(self.answers)

    def recorded(self, check_build: Callable[..., bool]) -> Callable[..., bool]:
        answers = self.answers

        def check_and_record(isa: Any, code: str) -> bool:
            answer = check_build(isa, code)
            answers[probe_key(isa, code)] = bool(answer)
            return answer

        return check_and_record

    def take_answers(self, answers: dict[ProbeKey, bool]) -> None:
        """Pick this process's vector ISA with ``answers`` standing in for the probes they
        cover; nothing where the process has picked it already."""
        from torch._inductor import cpu_vec_isa

        if not answers or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
            return
        probe = cpu_vec_isa.VecISA.check_build

        def answered(isa: Any, code: str) -> bool:
            answer = answers.get(probe_key(isa, code))
            return probe(isa, code) if answer is None else answer

        with self.lock:
            cpu_vec_isa.VecISA.check_build = answered  # the class's own, put back below
            try:
                picked = cpu_vec_isa.pick_vec_isa()
            finally:
                cpu_vec_isa.VecISA.check_build = probe
        log.debug("vector ISA taken from the compile process: %s", picked)


class HeaderRecord:
    """The precompiled headers' paths this process found (a compile process), and another
    process's paths standing in for the search (a serving process)."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        self.taken: dict[str, str] = {}
        self.lock = threading.Lock()
        self.wrapped = False

    def wrap(self) -> None:
        """Put the recording-and-answering search in Inductor's place, once per process."""
        from torch._inductor import codecache

        with self.lock:
            if self.wrapped:
                return
            self.wrapped = True
            search = getattr(codecache, "_precompile_header", None)
            if search is None:  # a release without precompiled headers: nothing to answer
                return
            paths, taken = self.paths, self.taken

            def answered(header: str, hashable_cmd_line: str, **command: Any) -> str:
                key = header_key(header, hashable_cmd_line, command)
                path = taken.get(key)
                if path is None or not os.path.exists(path):
                    path = search(header, hashable_cmd_line, **command)
                paths[key] = path
                return path

            codecache._precompile_header = answered

    @contextlib.contextmanager
    def recording_answers(self) -> Iterator[dict[str, str]]:
        self.wrap()
        found: dict[str, str] = {}
        try:
            yield found
        finally:
            found.update(self.paths)

    def take_answers(self, paths: dict[str, str]) -> None:
        if paths:
            self.taken.update(paths)
            self.wrap()


def header_key(header: str, hashable_cmd_line: str, command: dict[str, Any]) -> str:
    # By type and text: the objects' reprs (a vector ISA's) may hold addresses.
    options = repr([(k, type(v).__qualname__, str(v)) for k, v in sorted(command.items())])
    text = "\n".join([header, hashable_cmd_line, options])
    return hashlib.sha256(text.encode()).hexdigest()


class HostAnswers:
    """Both records (see the module docstring); facts are ``{"vec_isa": ..., "headers": ...}``
    (an older file's facts: the probes' answers alone)."""

    def __init__(self) -> None:
        self.probes = ProbeRecord()
        self.headers = HeaderRecord()

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[str, Any]]:
        facts: dict[str, Any] = {}
        with self.probes.recording_answers() as probes, self.headers.recording_answers() as paths:
            yield facts
        facts.update(vec_isa=probes, headers=paths)

    def take(self, facts: dict[Any, Any]) -> None:
        if "vec_isa" not in facts:  # stored before the headers were recorded
            facts = {"vec_isa": facts}
        self.probes.take_answers(facts.get("vec_isa") or {})
        self.headers.take_answers(facts.get("headers") or {})


HOST_ANSWERS = HostAnswers()
"""Process-wide: the questions and their caches are process-wide in Inductor too."""
