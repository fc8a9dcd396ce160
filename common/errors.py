"""User mistakes end with one clear line and exit status 2, never a traceback."""
import argparse
import sys


class UserError(ValueError):
    """A mistake in what the user asked for (bad task, backend, shape, budget)."""


def exit_on_user_error(fn):
    """Decorator for `main()`: print a UserError as one line and exit 2."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the scripts: a usage mistake is a UserError (one line,
    exit status 2 under `exit_on_user_error`), not argparse's usage block."""

    @classmethod
    def from_doc(cls, doc: str) -> "ArgumentParser":
        """A script's parser: its docstring's first line as the description,
        the rest (usage examples, notes) as the epilog."""
        return cls(description=doc.split("\n")[0], epilog=doc.split("\n", 2)[2],
                   formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} --help)")
