"""Failures an operation reports with a stable code instead of a traceback."""


class OperationError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
