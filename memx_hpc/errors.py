"""Domain errors. Exit codes follow the design: 1 user error, 2 system error."""

from __future__ import annotations


class MemxError(Exception):
    """Base of every error the CLI turns into a one-line message."""

    exit_code = 2


class SpecError(MemxError):
    """Bad user input: names the file, the field path, what was found and what is allowed."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 found: object = None, allowed: str | None = None) -> None:
        self.file = file
        self.field = field
        self.found = found
        self.allowed = allowed
        self.detail = message
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.field:
            where.append(self.field)
        head = ": ".join(where)
        text = f"{head}: {self.detail}" if head else self.detail
        if self.found is not None:
            text += f" (found {self.found!r})"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        return text

    def within(self, path: str) -> "SpecError":
        """The same error with its field path prefixed by ``path`` (where the spec sits in a document)."""
        if not path:
            return self
        if not self.field:
            inner = path
        elif self.field.startswith("["):
            inner = f"{path}{self.field}"
        else:
            inner = f"{path}.{self.field}"
        return SpecError(self.detail, file=self.file, field=inner, found=self.found, allowed=self.allowed)

    def with_file(self, file: str) -> "SpecError":
        if self.file:
            return self
        return SpecError(self.detail, file=file, field=self.field, found=self.found, allowed=self.allowed)


class SystemFailure(MemxError):
    """Something outside the user's input failed: Slurm/MPI unreachable, a job failed."""

    exit_code = 2
