"""Remove nodes whose results nobody uses.

    before: %t = aten.t(%w); %unused = aten.mul(%x, 2); return (%t,)
    after:  %t = aten.t(%w); return (%t,)

Ops that write memory (in-place, ``out=``) are kept: FX treats them as impure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from npugraph_ex.config import Config


def eliminate_dead_code(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    gm.graph.eliminate_dead_code()
