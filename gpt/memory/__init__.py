"""The GPU memory planner without a GPU: a stage's peak memory predicted on fake tensors, in rooms.

estimator.py estimates one stage (its docstring says how); planner.py the reference ladder, the largest batch that
fits and the comparison with measured records; recorder.py writes the simulated step as a CUDA allocator snapshot;
__main__.py is the command line (`python -m gpt.memory estimate|reference|fit|compare|snapshot --help`). The
section of results.md the planner's reports make is the report's (gpt/report/memory_planner.py).
This file imports nothing."""
