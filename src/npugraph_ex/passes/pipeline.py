"""The order of the passes, written once.

PyTorch's own stream regions turned into stream blocks first (so that every later pass, the
user's included, sees the blocks and no fusion crosses them), custom pre pass, the common
optimisations, custom post pass, then the clean-up the capture relies
on, the re-inplacing passes, the plan of where lanes wait for stream blocks (after every pass
that writes in place, so it sees every write), the copies of host scalar inputs made
non-blocking (after every pass that could add or drop a copy), and last the split of data ints to
the host (it changes the graph's inputs and outputs, so nothing may run after it). Each built-in
optimisation runs behind the option of its name.

With ``static_kernel_compile`` the graph goes on to Inductor, which removes cats, plans memory
and re-inplaces itself; the capture-only passes are skipped there: the ``out=`` and in-place
forms they write are not what Inductor lowers.
"""

from __future__ import annotations

from collections.abc import Callable

from npugraph_ex.config import Config
from npugraph_ex.passes.custom import run_custom_post_pass, run_custom_pre_pass
from npugraph_ex.passes.dead_code import eliminate_dead_code
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.manager import GraphPass
from npugraph_ex.passes.native_streams import native_streams
from npugraph_ex.passes.plan_streams import plan_streams
from npugraph_ex.passes.reinplace import reinplace
from npugraph_ex.passes.reinplace_inputs import reinplace_inputs
from npugraph_ex.passes.remove_cat import remove_cat_ops
from npugraph_ex.passes.remove_noop import remove_noop_ops
from npugraph_ex.passes.split_host_ints import split_host_ints_pass
from npugraph_ex.passes.unblock_host_copies import unblock_host_copies


def for_capture(option: str) -> Callable[[Config], bool]:
    """Enabled by ``option``, unless the graph is lowered to static kernels instead."""
    return lambda config: getattr(config, option) and not config.static_kernel_compile


PIPELINE: tuple[GraphPass, ...] = (
    GraphPass(
        "native_streams", native_streams, enabled=lambda config: not config.static_kernel_compile
    ),
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
    GraphPass("remove_cat_ops", remove_cat_ops, enabled=for_capture("remove_cat_ops")),
    GraphPass("dead_code_elimination", eliminate_dead_code),
    GraphPass("inplace_pass", reinplace, enabled=for_capture("inplace_pass")),
    GraphPass("input_inplace_pass", reinplace_inputs, enabled=for_capture("input_inplace_pass")),
    GraphPass(
        "plan_streams", plan_streams, enabled=lambda config: not config.static_kernel_compile
    ),
    GraphPass("unblock_host_copies", unblock_host_copies),
    # Last: it changes the graph's inputs, which every pass before it reads as example_inputs.
    GraphPass("split_host_ints", split_host_ints_pass),
)
