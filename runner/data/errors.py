"""The one error the data pipeline raises: it always says which file and which line is at fault."""

from __future__ import annotations


class DatasetError(ValueError):
    """The dataset cannot be used as given (malformed record, empty after filtering, unreadable)."""

    def __init__(self, message: str, *, uri: str | None = None, line: int | None = None) -> None:
        where = ""
        if uri is not None:
            where = f"{uri}:{line}: " if line is not None else f"{uri}: "
        super().__init__(f"{where}{message}")
        self.uri = uri
        self.line = line
