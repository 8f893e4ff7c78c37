"""The pattern registry behind ``pattern_fusion_pass`` and ``npugraph_ex.register_replacement``.

Built on Inductor's pattern matcher: a pattern is an example function traced to ATen; a match is
re-traced with the matched shapes and checked again before it is replaced, so sizes a pattern
was traced with never stand in for other sizes. Patterns are traced as the backend's graphs are
(``make_fx`` without decompositions: the ATen ops AOTAutograd's inference graphs hold).

    registry   the pattern passes, ``register_replacement``, ``add_replacement``, tracing
    registration  what ``register_replacement`` checks of its arguments (``TypeError``s)
    builtin    the built-in patterns in order (one module each), registered on first use
               (imported where they are registered: it imports every pattern module)

This module only hands their names on.
"""

from npugraph_ex.passes.patterns.registry import (
    add_replacement,
    canonical_spellings,
    capture_registry,
    product_registry,
    register_replacement,
    registry,
    trace_aten,
)

__all__ = [
    "add_replacement",
    "canonical_spellings",
    "capture_registry",
    "product_registry",
    "register_replacement",
    "registry",
    "trace_aten",
]
