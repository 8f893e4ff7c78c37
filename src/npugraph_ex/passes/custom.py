"""The user's own passes (``post_grad_custom_pre_pass`` / ``post_grad_custom_post_pass``).

Each is called as ``fn(gm, example_inputs, config)`` and may edit ``gm`` in place or return a new
GraphModule; it runs under the pass manager like a built-in pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from npugraph_ex.config import Config


def run_custom_pre_pass(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> torch.fx.GraphModule | None:
    return config.post_grad_custom_pre_pass(gm, example_inputs, config)


def run_custom_post_pass(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> torch.fx.GraphModule | None:
    return config.post_grad_custom_post_pass(gm, example_inputs, config)
