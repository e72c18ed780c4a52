"""results.md from a run's JSON records, in rooms (gpt/report/__main__.py lists them; `python -m gpt.report` runs it).

This file imports nothing: importing the package must not import the rooms (the numbers' formatting the rooms
share with the optimizations' own findings is gpt/formatting.py, below both)."""
