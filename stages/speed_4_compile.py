"""Speed ladder, stage 4: torch.compile (mode "reduce-overhead" on CUDA, default on the CPU).

Parent: speed_3_non_blocking. Reference (1x H100): 1.09 s per 10240 samples (-40%).

TorchDynamo captures the forward and backward into graphs and TorchInductor generates fused kernels:
attention's scale-mask-softmax-dropout chain, GELU, layer norms and residual adds each become one pass
over memory instead of several. On CUDA "reduce-overhead" also records CUDA graphs, replaying a whole
step's kernels with one launch. Compilation happens in the first step and is reported apart.
Code: cfg.compile -> gpt/train.py:build_model -> gpt/optimizations/compilation.py:compile_model (its mode:
compile_mode).
"""

CHANGE = "torch.compile"
REFERENCE = {"seconds": 1.09}


def change(cfg):
    cfg.compile = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)
