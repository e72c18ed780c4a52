"""The GPU memory planner without a GPU: a stage's peak memory predicted on fake tensors (docs/memory-planner.md).

Its modules: docs/design.md's layout; `python -m gpt.memory --help` the command line. This file imports nothing.
"""
