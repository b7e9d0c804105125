"""Request bodies. Types are strict (JSON types, no coercion of "5" to 5) and
unknown fields are ignored, as OpenAI-compatible servers do; the routes reject
the known fields we cannot honour instead of ignoring them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Stops = str | Annotated[list[str], Field(max_length=16)]  # one string of any length, or up to 16

# OpenAI's documented ranges, name -> (least, most), None where unbounded: the OpenAI routes
# refuse a value outside in OpenAI's words (`openai.check_ranges`); the OpenAPI document states them
OPENAI_RANGES = {
    "temperature": (0, 2),
    "top_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
    "n": (1, 128),
    "max_tokens": (1, None),
    "max_completion_tokens": (1, None),
    "max_output_tokens": (1, None),
    "logprobs": (0, 20),
    "top_logprobs": (0, 20),
}
OPENAI_MAX_STOPS = 4
OpenAIStops = str | Annotated[list[str], Field(json_schema_extra={"maxItems": OPENAI_MAX_STOPS})]


def openai_field(name: str, description: str | None = None, least: float | None = None):
    """An optional field with OpenAI's range for `name` (`least`: another lower bound) in the
    OpenAPI document; the route checks it (`openai.check_ranges`), so the error is OpenAI's."""
    lo, hi = OPENAI_RANGES[name]
    lo = lo if least is None else least
    bounds = {key: v for key, v in (("minimum", lo), ("maximum", hi)) if v is not None}
    return Field(None, description=description, json_schema_extra=bounds)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


# --- OpenAI ---------------------------------------------------------------------
class ContentPart(_Body):
    type: str = Field(..., description="'text'; the others (image_url, input_audio, file) get a 400")
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict] | None = Field(None, description="an assistant's calls, arguments as JSON strings")
    tool_call_id: str | None = Field(None, description="the call a tool message answers")
    name: str | None = None
    reasoning_content: str | None = Field(None, description="an assistant's reasoning, for templates that render it")


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAISampling(_Body):
    model: str | None = Field(None, description="the served model's id; optional")
    max_tokens: int | None = openai_field("max_tokens", "absent: up to the end of the context")
    max_completion_tokens: int | None = openai_field("max_completion_tokens")
    temperature: float | None = openai_field("temperature", "default 1.0; 0 is greedy")
    top_p: float | None = openai_field("top_p", "0 keeps the most likely token only")
    top_k: int | None = Field(None, ge=0, description="extra: 0 disables")
    min_p: float | None = Field(None, ge=0, le=1, description="extra")
    repeat_penalty: float | None = Field(None, gt=0, description="extra: 1.0 disables")
    repeat_last_n: int | None = Field(
        None, ge=-1, description="extra: the penalties' window (default 64; 0 disables, -1 the whole context)"
    )
    seed: int | None = Field(None, description="negative: random")
    stop: OpenAIStops | None = Field(None, description=f"up to {OPENAI_MAX_STOPS} strings")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = openai_field("n", "choices, at most the server's --parallel; they share the prompt")
    presence_penalty: float | None = openai_field(
        "presence_penalty", "minus this from the logit of a token in the last 64 of prompt and reply"
    )
    frequency_penalty: float | None = openai_field("frequency_penalty", "minus this times the token's count there")
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (a string) -> a bias from -100 to 100 added to its logit"
    )
    response_format: dict | None = Field(
        None,
        description="{'type': 'text' | 'json_object' | 'json_schema', 'json_schema': {'schema': ...}}: "
        "the output constrained by the grammar engine",
    )
    json_schema: dict | None = Field(None, description="llama.cpp's extra: constrain the output to this schema")
    grammar: str | None = Field(None, description="llama.cpp's extra: a GBNF (or Lark) grammar for the output")
    speculative_type: Literal["none", "ngram-simple", "draft"] | None = Field(
        None,
        alias="speculative.type",
        description="llama-server's: speculative decoding for this request (none turns it off; draft needs the "
        "server's -md); default: the server's --spec-type. The reply is the same either way",
    )
    speculative_n_max: int | None = Field(
        None, alias="speculative.n_max", ge=0, description="llama-server's: draft tokens at most per step (0: off)"
    )
    speculative_n_min: int | None = Field(
        None, alias="speculative.n_min", ge=0, description="llama-server's: draft tokens at least, else no draft"
    )


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(..., description="at least one message")
    tools: list[dict] | None = Field(
        None, description="functions the model may call: {type: function, function: {name, description, parameters}}"
    )
    tool_choice: str | dict | None = Field(
        None, description="none, auto (default), required, or {type: function, function: {name}}"
    )
    parallel_tool_calls: bool | None = Field(None, description="more than one call per reply (default true)")
    logprobs: bool | None = Field(None, description="each output token's log-probability")
    top_logprobs: int | None = openai_field("top_logprobs", "alternatives per token (needs logprobs)")
    reasoning_format: Literal["auto", "deepseek", "none"] | None = Field(
        None,
        description="llama.cpp's: a thinking model's reasoning in reasoning_content (auto, deepseek; the "
        "default) or left in the content (none)",
    )
    reasoning_effort: str | None = Field(
        None,
        description="'none' asks a thinking model not to think; low, medium or high set the template's "
        "reasoning_effort (gpt-oss; minimal and none are low there: it always reasons)",
    )
    chat_template_kwargs: dict | None = Field(
        None, description="more chat template variables, e.g. {'enable_thinking': false} (Qwen3)"
    )
    continue_final_message: bool | None = Field(
        None, description="continue the last message, an assistant's (default: whenever the assistant speaks last)"
    )
    add_generation_prompt: bool | None = Field(None, description="false: end the prompt with the last message's turn")


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="text, token ids, or a list of either: one set of choices per prompt"
    )
    max_tokens: int | None = openai_field("max_tokens", "absent: up to the end of the context; 0 with echo", least=0)
    logprobs: int | None = openai_field("logprobs", "log-probabilities of each token and its N best")
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


# --- OpenAI Responses ------------------------------------------------------------
class _ResponsesBody(_Body):
    model: str | None = Field(None, description="the served model's id; optional")
    input: str | list[dict] | None = Field(
        None,
        description="text (a user message), or items: messages (input_text / output_text parts), "
        "function_call and function_call_output items, reasoning items",
    )
    instructions: str | None = Field(None, description="a system message before the input (not carried over)")
    previous_response_id: str | None = Field(None, description="a stored response whose conversation this continues")
    tools: list[dict] | None = Field(None, description="functions: {type: function, name, description, parameters}")
    tool_choice: str | dict | None = Field(None, description="none, auto (default), required or {type: function, name}")
    parallel_tool_calls: bool | None = Field(None, description="more than one call per reply (default true)")
    text: dict | None = Field(
        None, description="{format: {type: text | json_object | json_schema, schema}}: the output constrained"
    )
    reasoning: dict | None = Field(None, description="{effort: none | low | medium | high}, for models that think")
    conversation: str | dict | None = Field(None, description="not supported: send previous_response_id")
    prompt: dict | None = Field(None, description="prompt templates are not supported")


class ResponsesRequest(_ResponsesBody):
    input: str | list[dict] = Field(..., description="text (a user message) or a list of input items")
    max_output_tokens: int | None = openai_field("max_output_tokens", "absent: up to the end of the context")
    temperature: float | None = openai_field("temperature", "default 1.0; 0 is greedy")
    top_p: float | None = openai_field("top_p")
    stream: bool = False
    store: bool = Field(True, description="keep the response (in memory, the latest few) for GET and chaining")
    metadata: dict[str, str] | None = Field(None, max_length=16)
    truncation: Literal["disabled"] | None = Field(None, description="'auto' is not supported")
    background: Literal[False] | None = Field(None, description="background responses are not supported")
    top_logprobs: Literal[0] | None = Field(None, description="log-probabilities are not supported")


class InputTokensRequest(_ResponsesBody):
    """/v1/responses/input_tokens: what the prompt of such a request would count."""


# --- Ollama ----------------------------------------------------------------------
class OllamaOptions(_Body):
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0)
    repeat_last_n: int | None = Field(None, ge=-1, description="the penalties' window; 0 disables, -1 the context")
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    num_predict: int | None = Field(None, description="-1 or -2: up to the end of the context")
    stop: Stops | None = None
    num_ctx: int | None = Field(None, description="this request's context, at most the server's --ctx")
    spec_type: Literal["none", "ngram-simple", "draft"] | None = Field(
        None, description="speculative decoding for this request (llama.cpp's --spec-type; none turns it off)"
    )
    draft_max: int | None = Field(None, ge=0, description="draft tokens at most per step (llama.cpp's --draft-max)")
    draft_min: int | None = Field(None, ge=0, description="draft tokens at least, else no draft (--draft-min)")


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict] | None = Field(None, description="an assistant's calls, arguments as objects")
    tool_name: str | None = None
    thinking: str | None = Field(None, description="an assistant's reasoning, for templates that render it")


class _OllamaRequest(_Body):
    model: str = Field(..., description="the served model's name")
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict | None = Field(None, description='"json" or a JSON schema: the output constrained to it')
    think: bool | str | None = Field(
        None,
        description="true, false, or high/medium/low/max (true); a model that "
        "thinks does by default; a 400 for one that does not",
    )
    keep_alive: str | int | float | None = None
    logprobs: bool | None = Field(None, description="each output token's log-probability")
    top_logprobs: int | None = Field(None, description="alternatives per token, 0-20 (with logprobs)")


class OllamaChatRequest(_OllamaRequest):
    messages: list[OllamaMessage] | None = Field(None, description="absent or null: just load the model")
    tools: list[dict] | None = Field(None, description="functions the model may call (OpenAI's spec)")


class OllamaGenerateRequest(_OllamaRequest):
    prompt: str | None = Field(None, description="empty: just load the model")
    system: str | None = None
    template: str | None = Field(None, description="not supported")
    suffix: str | None = Field(None, description="not supported")
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class OllamaPullRequest(_Body):
    model: str | None = None
    name: str | None = Field(None, description="older clients' spelling of model")
    stream: bool = True
    insecure: bool = False


class OllamaCreateRequest(_Body):
    model: str | None = None
    name: str | None = Field(None, description="older clients' spelling of model")
    from_: str | None = Field(None, alias="from", description="a model name, or a .gguf path on the server")
    parameters: dict | None = Field(None, description="Modelfile PARAMETERs: num_ctx, kv_cache_type, temperature, ...")
    system: str | None = None
    template: str | None = None
    modelfile: str | None = Field(None, description="older clients: the Modelfile's text")
    stream: bool = True
    quantize: str | None = None
    files: dict | None = None
    adapters: dict | None = None
    messages: list | None = None


class ModelNameRequest(_Body):
    model: str = Field(..., description="the model to load or unload")


class OllamaShowRequest(_Body):
    model: str | None = None
    name: str | None = Field(None, description="older clients' spelling of model")
    verbose: bool = False


# --- embeddings (OpenAI, then Ollama's newer and older route) ---------------------------
class EmbeddingRequest(_Body):
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="text, token ids, or a list of either (up to 2048): one vector each"
    )
    model: str | None = Field(None, description="the served model's id; optional")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's float32 bytes (little-endian), base64-encoded"
    )
    dimensions: int | None = Field(None, description="only the model's own dimension (its hidden size)")
    user: str | None = None


class OllamaEmbedRequest(_Body):
    model: str = Field(..., description="the served model's name")
    input: str | list[str] | None = Field(None, description="text or texts; absent or empty: just load the model")
    truncate: bool = Field(True, description="cut an input over the context to its first tokens; false: a 400")
    dimensions: int | None = Field(None, description="shorter vectors: the first N values, normalized again")
    options: OllamaOptions | None = Field(None, description="num_ctx caps an input's tokens; the rest is unused")
    keep_alive: str | int | float | None = None


class OllamaEmbeddingsRequest(_Body):
    model: str = Field(..., description="the served model's name")
    prompt: str | None = Field(None, description="absent or empty: just load the model")
    options: OllamaOptions | None = Field(None, description="num_ctx caps the prompt's tokens; the rest is unused")
    keep_alive: str | int | float | None = None


# --- llama.cpp / vLLM tokenizer routes ------------------------------------------------
class TokenizeRequest(_Body):
    model: str | None = Field(None, description="the model whose tokenizer (default: the default model)")
    content: str | None = Field(None, description="llama.cpp's name for the text")
    prompt: str | None = Field(None, description="vLLM's name for the text")
    add_special: bool | None = Field(None, description="llama.cpp: add BOS (default false)")
    add_special_tokens: bool | None = Field(None, description="vLLM: add BOS")
    parse_special: bool = Field(True, description="special-token text becomes the special token")
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    model: str | None = Field(None, description="the model whose tokenizer (default: the default model)")
    tokens: list[int]


# --- documents (the web page's routes; scripts may use them too) ----------------------
DocumentMode = Literal["auto", "full", "rlv"]


class AddDocumentRequest(_Body):
    text: str = Field(..., min_length=1, description="the document's text (Markdown or plain)")
    name: str | None = Field(None, max_length=200, description="what the list calls it (default 'pasted text')")
    mode: DocumentMode = Field(
        "auto",
        description="full: the whole document in the KV cache; rlv: read in parts; "
        "auto: full when it fits the model's working memory",
    )


class OpenDocumentRequest(_Body):
    mode: DocumentMode | None = Field(None, description="absent: the mode it was added in")


class AskDocumentRequest(_Body):
    question: str = Field(..., min_length=1)
    mode: DocumentMode | None = Field(None, description="absent: the document's mode")
    stream: bool = Field(False, description="true: SSE events (progress, read, delta, answer), then [DONE]")
    max_tokens: int = Field(96, ge=1, le=512, description="a cap: the answer ends at its first sentence or line")


# --- Anthropic ---------------------------------------------------------------------------
class AnthropicBlock(_Body):
    type: str = Field(
        ...,
        description="text, thinking, tool_use (an assistant's), tool_result (a user's); image and document get a 400",
    )
    text: str | None = None
    thinking: str | None = None
    id: str | None = Field(None, description="a tool_use block's id")
    name: str | None = Field(None, description="a tool_use block's tool")
    input: dict | None = Field(None, description="a tool_use block's arguments")
    tool_use_id: str | None = Field(None, description="the tool_use a tool_result answers")
    content: str | list[dict] | None = Field(None, description="a tool_result's text, or its text blocks")
    is_error: bool | None = None


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class AnthropicTool(_Body):
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict | None = Field(None, description="required: a JSON schema of type object, the tool's input")
    type: str | None = Field(None, description="custom (the default); Anthropic's server tools get a 400")


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="the tool to call (type tool)")
    disable_parallel_tool_use: bool | None = None


class AnthropicThinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, description="enabled: at least 1024, below max_tokens")


class AnthropicText(_Body):
    type: Literal["text"]
    text: str


class AnthropicOutputConfig(_Body):
    format: dict | None = Field(None, description="{type: json_schema, schema}: the output constrained to it")
    effort: str | None = Field(None, description="the template's reasoning_effort, for models that read it")


class _AnthropicPrompt(_Body):
    model: str = Field(..., description="the served model's name")
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: str | list[AnthropicText] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = Field(
        None, description="enabled or disabled: a thinking model's reasoning, as thinking blocks; absent: its default"
    )
    output_config: AnthropicOutputConfig | None = None


class MessagesRequest(_AnthropicPrompt):
    max_tokens: int = Field(..., ge=1, description="the reply's cap; it also ends where the context does")
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1, description="default 1.0")
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0 disables")
    stream: bool = False
    metadata: dict | None = Field(None, description="accepted (user_id), not used")


class CountTokensRequest(_AnthropicPrompt):
    pass
