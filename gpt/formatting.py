"""Numbers and tables for people: the report's, the optimizations' findings', the planner's and run_all's.

No imports from the project: it is ground that anything may stand on.
"""

import math


def fmt_pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.0f}%" if abs(round(x, 1)) >= 10 else f"{x:+.1f}%"


def fmt_num(x: float | None, digits: int = 3) -> str:
    """`digits` significant figures, no exponent for everyday magnitudes."""
    if x is None:
        return ""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def fmt_mib(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def fmt_time(seconds: float | None) -> str:
    """Seconds for a person: 850 ms, 4.2 s, 3 min 12 s."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def fmt_minutes(seconds: float) -> str:
    """Seconds to the second in minutes and seconds: 6 min 1 s, 48 s (a plan's, a run's, a test suite's)."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def fmt_share(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}%" if x < 0.95 else f"{x:.0f}%"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def steady_steps(record: dict, parent: dict) -> str:
    """How a stage's steady (median) step compares with its parent's, in words."""
    m, p = record["metrics"], parent["metrics"]
    return f"steady step {fmt_time(m['step_time_median_s'])} vs {fmt_time(p['step_time_median_s'])} before"
