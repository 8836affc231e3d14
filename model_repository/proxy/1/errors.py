"""What the serving side reports, in its own terms; app.py maps each kind to an HTTP status (STATUS there)."""


class ServiceError(Exception):
    """message: for the client; code: machine-readable; param: the request field at fault; retry_after: seconds;
    field: the item the message leads with (`input[3]`; None: none), for a route to rename (rename_field)."""

    def __init__(self, message, code, param=None, retry_after=None, field=None):
        super().__init__(message)
        self.message, self.code, self.param, self.retry_after = message, code, param, retry_after
        self.field = field


def rename_field(error, field):
    """An error (ServiceError or http_errors.ApiError) about `error.field` restated about `field`: its message
    leads with the field, so the lead is replaced; nothing else of the message is read."""
    if error.field and error.message.startswith(error.field):
        error.message = field + error.message[len(error.field):]
    error.field = field


class InvalidInput(ServiceError):
    """The request's content is wrong (a text the tokenizer refuses, a bad document)."""


class OverLimit(InvalidInput):
    """The request is over a limit (a text too long, too many documents): 422, as the proxy's own limits."""


class NotFound(ServiceError):
    """No such model, or not loaded."""


class Conflict(ServiceError):
    """The action does not fit the server's state (models load only in explicit mode)."""


class LoadFailed(ServiceError):
    """A model's load failed: Triton's reason is in the message."""


class Overloaded(ServiceError):
    """A bounded queue is full: retry later."""


class Unavailable(ServiceError):
    """A model is not ready (loading, recovering) or Triton is starting or stopping."""


class Timeout(ServiceError):
    """The work did not finish within the request's deadline."""
