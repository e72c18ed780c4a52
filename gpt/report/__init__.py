"""results.md from a run's JSON records, in rooms (gpt/report/__main__.py lists them; `python -m gpt.report` runs it).

This file imports nothing: the optimizations (gpt/optimizations) read gpt/report/formatting.py for their own
findings, and the report reads them, so importing the package must not import the rooms."""
