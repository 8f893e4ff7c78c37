"""A script written for TorchAir, with only its import changed (``import torchair`` before).

Every group of TorchAir's ``CompilerConfig`` is set to a value TorchAir accepts, a custom pass
reads the config it is given, ``custom_decompositions`` rewrite an op, and a small module is
compiled with ``torch.compile`` and checked against eager. Run by ``test_torchair_script.py`` in
a fresh process, so that the one-time warnings are seen from the start:
``python torchair_script.py WORK_DIR``; prints a JSON report on its last line.
"""

import json
import logging
import os
import sys
import warnings

import torch
from torch._functorch.aot_autograd import aot_module_simplified

import npugraph_ex as torchair

logging.basicConfig(format="%(levelname)s %(name)s %(message)s")

work = sys.argv[1]
os.makedirs(os.path.join(work, "dumps"), exist_ok=True)
with open(os.path.join(work, "fusion_switch.cfg"), "w") as f:
    f.write("{}\n")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


reads = []


def read_config(gm, example_inputs, config):
    reads.append(
        {
            "mode": config.mode.value,
            "capture_limit": config.debug.aclgraph.static_capture_size_limit.value,
            "clone_output": config.debug.aclgraph.enable_output_clone.value,
            "frozen_parameter": config.experimental_config.frozen_parameter.value,
            "oo_level": config.ge_config.oo_level.value,
            "silu": sum(node.target == torch.ops.aten.silu.default for node in gm.graph.nodes),
        }
    )


def silu(x):
    return x * torch.sigmoid(x)


config = torchair.CompilerConfig()
config.debug.run_eagerly = False
config.debug.deadlock_check = False
config.debug.graph_dump.type = "py"
config.debug.graph_dump.path = os.path.join(work, "graphs")
config.debug.aclgraph.clone_input = True
config.debug.aclgraph.static_capture_size_limit = 8
config.debug.aclgraph.enable_output_clone = True
config.debug.aclgraph.disable_mempool_reuse_in_same_fx = False
config.debug.aclgraph.disable_reinplace_inplaceable_ops_pass = False
config.debug.aclgraph.disable_reinplace_input_mutated_ops_pass = False
config.debug.aclgraph.remove_cat_ops = True
config.experimental_config.frozen_parameter = True
config.experimental_config.remove_noop_ops = True
config.experimental_config.pattern_fusion_pass = True
config.experimental_config.keep_inference_input_mutations = True
config.experimental_config.tiling_schedule_optimize = True
config.experimental_config.topology_sorting_strategy = "StableRDFS"
config.experimental_config.enable_view_optimize = False
config.experimental_config.aclgraph._aclnn_static_shape_kernel = False
config.experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index = 0
config.experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range = [1, 2, 4, 8]
config.dump_config.enable_dump = True
config.dump_config.dump_path = os.path.join(work, "dumps")
config.dump_config.dump_step = "0"
config.dump_config.dump_mode = "all"
config.dump_config.data_dump_stage = "optimized"
config.aclgraph_config.use_custom_pool = None
config.ge_config.oo_level = "O1"
config.ge_config.enable_single_stream = True
config.inference_config.dynamic_gears_merge_policy = "product"
config.aoe_config.aoe_mode = "2"
config.fusion_config.fusion_switch_file = os.path.join(work, "fusion_switch.cfg")
config.export.export_mode = False
config.export.experimental.enable_record_nn_module_stack = True
config.post_grad_custom_pre_pass = read_config

decompositions = {torch.ops.aten.silu.default: silu}
npu_backend = torchair.get_npu_backend(compiler_config=config, custom_decompositions=decompositions)
npu_backend = torchair.get_npu_backend(compiler_config=config, custom_decompositions=decompositions)

torch.manual_seed(0)
model = Block().eval()
compiled = torch.compile(
    model,
    backend=npu_backend,
    dynamic=True,
    options={"_vllm_aclnn_static_kernel_sym_range": [1, 2, 4, 8]},
)
worst = 0.0
with torch.no_grad():
    for rows in (2, 4, 2, 4, 3):
        x = torch.randn(rows, 16)
        got, want = compiled(x), model(x)
        worst = max(worst, (got - want).abs().max().item())
        torch.testing.assert_close(got, want)


# TorchAir's other spellings: its graph compiler under an AOTAutograd backend of one's own, in
# the mode Hugging Face's CompileConfig passes, the scopes, and the deadlock check.
def scoped(x):
    with torchair.scope.op_never_timeout(True):
        y = x.sin()
    with torchair.scope.data_dump():
        y = y * 2
    with torchair.scope.limit_core_num(1, 0):
        return torch.mm(y, y.t()) + 1


def never_closed(x):
    torchair.scope.npu_stream_switch("s0").__enter__()
    return x.cos()


spelled = torchair.CompilerConfig()
spelled.mode = "reduce-overhead"
spelled.debug.deadlock_check = True
compiler = torchair.get_compiler(spelled)
logging.getLogger().setLevel(logging.INFO)  # the deadlock check says what it found at INFO
with warnings.catch_warnings(record=True) as caught, torch.no_grad():
    warnings.simplefilter("always")
    mine = torch.compile(
        scoped, backend=lambda gm, inputs: aot_module_simplified(gm, inputs, fw_compiler=compiler)
    )
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(mine(x), scoped(x))
try:
    torch.compile(never_closed, backend=npu_backend)(torch.randn(4))
    unbalanced = "no error"
except Exception as error:  # Dynamo wraps the backend's error
    unbalanced = str(getattr(error, "inner_exception", error))

print(
    json.dumps(
        {
            "worst": worst,
            "reads": reads,
            "dumps": sum(len(files) for _, _, files in os.walk(os.path.join(work, "dumps"))),
            "graphs": sum(len(files) for _, _, files in os.walk(os.path.join(work, "graphs"))),
            "spellings_warned": [str(w.message) for w in caught],
            "unbalanced": unbalanced,
        }
    )
)
