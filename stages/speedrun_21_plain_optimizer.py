"""Speedrun, stage 21: the optimizer stepped outside torch.optim, so a run that does not compile never imports Dynamo.

Parent: speedrun_20_untied_head. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
KEEPS THE MODEL: the same Muon and fused-AdamW steps, to the last bit.

What held the parent back: its set-up. Of a first run's ~10 s on 2 CPU cores, about 1.1 s is `import torch._dynamo`,
which torch.optim triggers in a run that never compiles: building an optimizer (`add_param_group` is wrapped by
`torch._disable_dynamo`) and every step (`_use_grad_for_differentiable` calls `torch._dynamo.graph_break()`). Dropped
on 2026-12-01 for want of a way round those wrappers; the way round is not to use them: the parent's two optimizers'
groups and state kept as torch keeps them and stepped with the same kernels, called directly (BatchedMuon's step, and
`torch._fused_adamw_`, what AdamW(fused=True) calls). Code: gpt/optimizations/plain_optimizer.py, switched on in
gpt/train.py:build_model.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "Muon and fused AdamW stepped outside torch.optim: no Dynamo import in an eager run"
KIND = "systems"


def change(cfg):
    cfg.plain_optimizer = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)
