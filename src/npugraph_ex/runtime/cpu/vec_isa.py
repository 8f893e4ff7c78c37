"""Inductor's vector-instruction probes, answered by the compile process instead of probed again.

Loading kernels compiled by Inductor's C++ wrapper asks which vector instructions this host's
compiler builds (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``). The first time in a
process that is a dozen compiler runs and child processes and about 60,000 Python calls (1 s
with Inductor's cache on disk warm, 5 s cold): done in the serving thread it stalls a call, done
in a thread beside it every call convoys behind it for as long. A compile process has asked the
same question of the same host before it compiled, so it records each probe's answer
(``recorded_answers``) and sends them with the kernels; the serving process takes them
(``take_answers``) and its first load costs milliseconds.

    compile process:  VecISA.check_build(code) -> True   recorded under (ISA, flags, code)
    serving process:  valid_vec_isa_list() with check_build answering from the record
                      (a probe the record lacks runs as it would)

Only answers the host gave are taken, so the list a process keeps is the one it would have
probed; a process that probed already is left as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
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
    """The probes' answers this process gave (a compile process), and the taking of another
    process's answers (a serving process)."""

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


PROBES = ProbeRecord()
"""Process-wide: the probes and their cache are process-wide in Inductor too."""
