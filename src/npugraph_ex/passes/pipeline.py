"""The order of the passes, written once.

Custom pre pass, the common optimisations, custom post pass, then the clean-up the capture relies
on and the re-inplacing passes. Each built-in optimisation runs behind the option of its name.
"""

from __future__ import annotations

from npugraph_ex.passes.custom import run_custom_post_pass, run_custom_pre_pass
from npugraph_ex.passes.dead_code import eliminate_dead_code
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.manager import GraphPass
from npugraph_ex.passes.reinplace import reinplace
from npugraph_ex.passes.reinplace_inputs import reinplace_inputs
from npugraph_ex.passes.remove_cat import remove_cat_ops
from npugraph_ex.passes.remove_noop import remove_noop_ops

PIPELINE: tuple[GraphPass, ...] = (
    GraphPass(
        "post_grad_custom_pre_pass",
        run_custom_pre_pass,
        enabled=lambda config: config.post_grad_custom_pre_pass is not None,
    ),
    GraphPass("remove_noop_ops", remove_noop_ops, enabled=lambda config: config.remove_noop_ops),
    GraphPass(
        "pattern_fusion_pass", fuse_patterns, enabled=lambda config: config.pattern_fusion_pass
    ),
    GraphPass(
        "post_grad_custom_post_pass",
        run_custom_post_pass,
        enabled=lambda config: config.post_grad_custom_post_pass is not None,
    ),
    GraphPass("remove_cat_ops", remove_cat_ops, enabled=lambda config: config.remove_cat_ops),
    GraphPass("dead_code_elimination", eliminate_dead_code),
    GraphPass("inplace_pass", reinplace, enabled=lambda config: config.inplace_pass),
    GraphPass(
        "input_inplace_pass", reinplace_inputs, enabled=lambda config: config.input_inplace_pass
    ),
)
