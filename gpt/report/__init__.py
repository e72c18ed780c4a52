"""results.md from a run's JSON records (`python -m gpt.report`); this file imports none of the report's modules."""
