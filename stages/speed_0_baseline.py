"""Speed ladder, stage 0: the baseline.

Parent: none. Reference (1x H100, GPT-mini, char-level Shakespeare): 7.68 s per 10240 samples.

GPT-mini (6 layers, 6 heads, 192 wide) with the explicit ("naive") attention, fp32, eager mode, batches
of 32 samples, and a DataLoader with no worker processes: every sample's text is cleaned and tokenised in
`__getitem__` (gpt/data.py: RawTextDataset) in the training process, between steps.
The reference found the GPU mostly idle here: small steps and data preparation in the same thread.
"""

CHANGE = "baseline: batch 32, num_workers 0, raw text tokenised per sample"
REFERENCE = {"seconds": 7.68}


def change(cfg):
    pass  # the profile's baseline settings (gpt/settings_profiles.py) are the baseline


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)
