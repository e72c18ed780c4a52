"""Bad user input ends a command with one line on stderr and exit code 2, never a traceback."""

import functools
import sys


class UserError(Exception):
    """An error the user can fix (bad flag, missing data, impossible shape); its message is the fix."""


def exit_on_user_error(main):
    """Decorate a CLI entry point: a UserError becomes `error: <message>` and exit code 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    return wrapper
