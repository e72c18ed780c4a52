"""Memory ladder, stage 0: the baseline, a GPT-2-large shaped model at batch 32.

Parent: none. Reference (1x H100, 36 layers, 20 heads, 1280 wide, vocab 65, block 128): 36272 MiB, 16.3 s
per 1024 samples.

fp32 parameters, gradients and AdamW's two moments take 16 bytes per parameter; on top of them the
forward pass keeps every layer's activations (with the naive attention, B x H x T x T scores, softmax and
dropout mask per layer) until backward uses them. The peak comes when the forward pass ends and every
layer's activations are alive (the reference's own H100 trace: in its cross_entropy).
"""

CHANGE = "baseline: batch 32"
REFERENCE = {"peak_mib": 36272, "seconds": 16.3}


def change(cfg):
    pass  # the profile's baseline settings (gpt/settings_profiles.py) are the baseline


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)
