"""User-facing errors: one line, no traceback, a non-zero exit."""


class TightKVError(Exception):
    """An error caused by user input (bad file, bad flag, context overflow).

    The CLI prints ``str(err)`` on one line and exits non-zero; the server maps it
    to a 4xx response.
    """


class GGUFError(TightKVError):
    """A GGUF file is missing, truncated, corrupt or unsupported."""


class RequestError(TightKVError):
    """A request the model cannot serve as asked (tools on a template without them, a
    token id out of the vocabulary); `param` names the field at fault, as OpenAI does."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextOverflowError(TightKVError):
    """A prompt (plus the tokens asked for) does not fit the context; `n_prompt_tokens` and
    `n_ctx` say by how much, where known (the server reports them, as llama.cpp does)."""

    def __init__(self, message: str, n_prompt_tokens: int | None = None, n_ctx: int | None = None):
        super().__init__(message)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx
