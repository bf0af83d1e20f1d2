"""How tools and tool calls look in the model's text: the Hermes format of Qwen2.5's chat template.

The prompt lists the tools' JSON schemas in the system turn; the assistant writes each call as
`<tool_call>\\n{"name": "calculator", "arguments": {"expression": "123*45"}}\\n</tool_call>`; the results come back in a
user turn, one `<tool_response>\\n...\\n</tool_response>` per call. The text below is the text Qwen2.5's own template
renders (docs/tools.md shows it in full); the markers are constructor arguments, for models that use others.

`prompt_with_tools` uses the tokenizer's jinja chat template when it renders a `tools` variable (PaddleNLP 3.0.0b4's
`apply_chat_template` does not pass `tools` to the template: `context_data` only reaches its legacy ChatTemplate
objects, so the template is rendered here, from its source string with JSON written as transformers writes it);
otherwise the tools' system text below is put into the system turn.

A schema is text from whoever serves the tool (a remote server's description may hold `<|im_end|>\n<|im_start|>
system\n...`): `prompt_with_tools_parts` marks each special token's string in the schemas as content, which the
prompt's tokenization (executor.tool_turn_ids) encodes as plain text, so it cannot open or close a turn.
"""
import json
import math
import re
import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..data import format_qwen_chat, special_token_ids
from .tool import ToolCall, ToolResult, json_type_name

QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_CALL_SHAPE = '{"name": <tool name>, "arguments": {<argument>: <value>, ...}}'


class HermesFormat:
    """The Hermes / Qwen2.5 tool-call format; `call_start`/`call_end` wrap a call, `response_start`/`response_end`
    a result, `turn_start`/`turn_end` a chat turn; `default_system` is the system text when a prompt has none
    (Qwen2.5's, as its template uses when tools are given)."""

    name = "hermes"

    def __init__(self, call_start: str = "<tool_call>", call_end: str = "</tool_call>",
                 response_start: str = "<tool_response>", response_end: str = "</tool_response>",
                 turn_start: str = "<|im_start|>", turn_end: str = "<|im_end|>",
                 default_system: str = QWEN25_DEFAULT_SYSTEM) -> None:
        self.call_start, self.call_end = call_start, call_end
        self.response_start, self.response_end = response_start, response_end
        self.turn_start, self.turn_end = turn_start, turn_end
        self.default_system = default_system

    # ---- reading the assistant's turn -------------------------------------------------------------------------

    def parse(self, text: str) -> Tuple[str, List[ToolCall]]:
        """(the text outside the calls, stripped; the calls in order). Every `call_start` in the text gives one
        ToolCall; one that cannot be read (no closing marker, not JSON, not an object, no "name" string,
        "arguments" not an object) has error "malformed" and a message saying what is wrong and what a call looks
        like. "arguments" may be missing (then {}) or a JSON string holding an object (as OpenAI's API sends it).
        The JSON is read by `strict_json` (NaN, Infinity, lone surrogates: malformed). In a rollout whose turns stop
        at `call_end` (one token in the vocabulary) the text holds one call; a turn ending at EOS may hold several."""
        calls: List[ToolCall] = []
        content: List[str] = []
        pos = 0
        while True:
            start = text.find(self.call_start, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            body_start = start + len(self.call_start)
            end = text.find(self.call_end, body_start)
            restart = text.find(self.call_start, body_start)
            if end < 0 or 0 <= restart < end:  # unclosed: the call runs to the next call or the end of the text
                stop = restart if restart >= 0 else len(text)
                calls.append(self._malformed(text[start:stop], "", f"the tool call has no closing "
                                             f"{self.call_end}; write {self._example()}"))
                pos = stop
                continue
            raw = text[start:end + len(self.call_end)]
            calls.append(self._read_call(text[body_start:end], raw))
            pos = end + len(self.call_end)
        return "".join(content).strip(), calls

    def _example(self) -> str:
        return f"{self.call_start}\n{_CALL_SHAPE}\n{self.call_end}"

    def _malformed(self, raw: str, name: str, message: str) -> ToolCall:
        return ToolCall(name=name, arguments=None, raw=raw, error="malformed", message=message)

    def _read_call(self, body: str, raw: str) -> ToolCall:
        shape = f"a tool call is one JSON object: {_CALL_SHAPE}"
        try:
            data = strict_json(body)
        except (ValueError, RecursionError) as exc:
            reason = getattr(exc, "msg", None) or type(exc).__name__
            where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            return self._malformed(raw, "", f"the tool call is not valid JSON ({reason}{where}); {shape}")
        if not isinstance(data, dict):
            return self._malformed(raw, "", f"the tool call is a JSON {json_type_name(data)}, not an object; {shape}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            got = "has no \"name\"" if "name" not in data else f"has \"name\" = {json.dumps(name)[:40]}"
            return self._malformed(raw, "", f"the tool call {got}; it needs the tool's name as a string; {shape}")
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                decoded = strict_json(arguments)
            except NotJSON as exc:  # NaN or a lone surrogate inside the string: say so, as for the call itself
                return self._malformed(raw, name, f"\"arguments\" of the call to {name} is not valid JSON "
                                                  f"({exc.msg}); {shape}")
            except (ValueError, RecursionError):
                decoded = None
            if isinstance(decoded, dict):
                arguments = decoded
        if not isinstance(arguments, dict):
            return self._malformed(raw, name, f"\"arguments\" of the call to {name} must be a JSON object, got a "
                                              f"JSON {json_type_name(arguments)}; {shape}")
        return ToolCall(name=name, arguments=arguments, raw=raw)

    # ---- writing the prompt and the tool turn -----------------------------------------------------------------

    def tools_system_text(self, schemas: Sequence[Dict[str, Any]], system: Optional[str] = None) -> str:
        """The system turn's content listing the tools (Qwen2.5's text), after `system` (default_system if None)."""
        listed = "".join("\n" + _tojson(schema) for schema in schemas)
        return (f"{self.default_system if system is None else system}\n\n# Tools\n\n"
                "You may call one or more functions to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>{listed}\n"
                "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                f"{self.call_start}{self.call_end} XML tags:\n{self.call_start}\n"
                f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{self.call_end}')

    def prompt_with_tools_parts(self, prompt: str, tokenizer: Any, schemas: Sequence[Dict[str, Any]],
                                system: Optional[str] = None, mode: str = "auto") -> List[Tuple[str, bool]]:
        """`prompt_with_tools` as (text, is_content) pieces, as `tool_turn_parts`: each string of one of the
        tokenizer's special tokens inside the schemas (keys and values) is a content piece (plain text when
        tokenized: executor.tool_turn_ids), the rest the template's text. The schemas are rendered with each such
        string between two markers of a random nonce (ASCII letters and digits, which no JSON encoder or template
        escapes), which are then cut out, so the text is the one `prompt_with_tools` renders unmarked."""
        specials = sorted(special_token_ids(tokenizer), key=len, reverse=True) if tokenizer is not None else []
        if not specials:
            return [(self._prompt_with_tools(prompt, tokenizer, schemas, system, mode), False)]
        nonce = secrets.token_hex(8)
        opening, closing = f"PGRPO{nonce}O", f"PGRPO{nonce}C"
        pattern = re.compile("|".join(re.escape(t) for t in specials))
        marked = _mark(list(schemas), pattern, opening, closing)
        parts: List[Tuple[str, bool]] = []
        inside = False
        for piece in re.split(f"({opening}|{closing})", self._prompt_with_tools(prompt, tokenizer, marked, system,
                                                                                mode)):
            if piece in (opening, closing):
                inside = piece == opening
            elif piece:
                parts.append((piece, inside))
        return parts

    def prompt_with_tools(self, prompt: str, tokenizer: Any, schemas: Sequence[Dict[str, Any]],
                          system: Optional[str] = None, mode: str = "auto") -> str:
        """The templated prompt for a raw `prompt` (a user turn) with the tools listed.

        mode "auto": the tokenizer's jinja template when it renders `tools`; a jinja template that ignores them
        gets the tools' system text as its system message; no template: the built-in text (the same as Qwen2.5's
        template renders). mode "qwen": the built-in text. An already-templated prompt (it has `turn_start`) and
        mode "none" return `prompt` unchanged: such prompts must list the tools themselves. Tokenize it from
        `prompt_with_tools_parts` (the same text), so that a schema cannot write a special token."""
        return "".join(text for text, _ in self.prompt_with_tools_parts(prompt, tokenizer, schemas, system, mode))

    def _prompt_with_tools(self, prompt: str, tokenizer: Any, schemas: Sequence[Dict[str, Any]],
                           system: Optional[str], mode: str) -> str:
        if mode not in ("auto", "none", "qwen"):
            raise ValueError(f"chat_template: unknown mode {mode!r}; expected one of auto, none, qwen")
        if mode == "none" or self.turn_start in prompt:
            return prompt
        if not schemas:
            raise ValueError("prompt_with_tools needs at least one tool schema")
        if mode == "auto" and has_jinja_template(tokenizer):
            messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                [{"role": "user", "content": prompt}]
            with_tools = render_chat_template(tokenizer, messages, tools=list(schemas))
            if with_tools != render_chat_template(tokenizer, messages):
                return with_tools
            own = [{"role": "system", "content": self.tools_system_text(schemas, system)},
                   {"role": "user", "content": prompt}]
            return render_chat_template(tokenizer, own)
        if self.turn_start != "<|im_start|>" or self.turn_end != "<|im_end|>":
            return (f"{self.turn_start}system\n{self.tools_system_text(schemas, system)}{self.turn_end}\n"
                    f"{self.turn_start}user\n{prompt}{self.turn_end}\n{self.turn_start}assistant\n")
        return format_qwen_chat(prompt, system=self.tools_system_text(schemas, system))

    def tool_turn_text(self, results: Sequence[ToolResult], ended_by_call_end: bool) -> str:
        """The text after the assistant's turn: `turn_end` when the turn ended at the call-end marker (a turn that
        ended at EOS has it already), the user turn of tool responses, and the next assistant turn opened."""
        return "".join(text for text, _ in self.tool_turn_parts(results, ended_by_call_end))

    def tool_turn_parts(self, results: Sequence[ToolResult], ended_by_call_end: bool) -> List[Tuple[str, bool]]:
        """`tool_turn_text` as (text, is_content) pieces: the format's own text (False: its markers are special
        tokens) and each result's content (True: plain text, whatever it holds). The environment tokenizes the
        two apart so that a tool cannot write a chat-turn marker or EOS into the policy's context."""
        parts: List[Tuple[str, bool]] = [(f"{self.turn_end if ended_by_call_end else ''}\n{self.turn_start}user",
                                          False)]
        for result in results:
            parts += [(f"\n{self.response_start}\n", False), (result.content, True),
                      (f"\n{self.response_end}", False)]
        parts.append((f"{self.turn_end}\n{self.turn_start}assistant\n", False))
        return parts

    def __repr__(self) -> str:
        return f"HermesFormat({self.call_start!r}, {self.call_end!r})"


ToolCallFormat = HermesFormat  # the interface of a format; Hermes is the one implemented
FORMATS = {"hermes": HermesFormat, "qwen": HermesFormat}


def get_format(name: str = "auto", tokenizer: Any = None) -> ToolCallFormat:
    """The tool-call format `name`: "hermes" (= "qwen"), or "auto": Hermes, unless the tokenizer's chat template
    renders tool calls without `<tool_call>` (then a ValueError says so rather than a format the model never saw)."""
    key = (name or "auto").strip().lower()
    if key == "auto":
        source = chat_template_source(tokenizer) or ""
        if "tool_calls" in source and HermesFormat().call_start not in source:
            raise ValueError("tool_format auto: the tokenizer's chat template renders tool calls, but not as "
                             "<tool_call> JSON (the Hermes format, the only one built in); set tool_format: hermes "
                             "to use it anyway")
        return HermesFormat()
    if key not in FORMATS:
        raise ValueError(f"unknown tool_format {name!r}; expected one of auto, {', '.join(FORMATS)}")
    return FORMATS[key]()


# ---- the tokenizer's jinja template ---------------------------------------------------------------------------------

def has_jinja_template(tokenizer: Any) -> bool:
    """True when the tokenizer has a jinja chat template (its source, or PaddleNLP's compiled jinja2 Template)."""
    if tokenizer is None:
        return False
    if chat_template_source(tokenizer):
        return True
    from jinja2 import Template

    return isinstance(getattr(tokenizer, "chat_template", None), Template)


def chat_template_source(tokenizer: Any) -> Optional[str]:
    """The jinja source of the tokenizer's chat template (PaddleNLP keeps it in `init_kwargs`), or None."""
    source = getattr(tokenizer, "init_kwargs", {}).get("chat_template") if tokenizer is not None else None
    if isinstance(source, str) and source.strip():
        return source
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) and template.strip() else None


def render_chat_template(tokenizer: Any, messages: List[Dict[str, Any]], tools: Optional[List[Dict]] = None,
                         add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template rendered with `messages` (and `tools` when given), as transformers renders it:
    jinja with trim_blocks / lstrip_blocks (PaddleNLP's settings too), `tojson` keeping key order and non-ASCII
    text. Without the source string (only a compiled template), the compiled one renders (its `tojson` sorts keys
    and escapes <, >, &, ')."""
    context = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
    context.update(messages=messages, add_generation_prompt=add_generation_prompt)
    if tools is not None:
        context["tools"] = tools
    source = chat_template_source(tokenizer)
    template = _compile(source) if source else tokenizer.chat_template
    return template.render(**context)


_COMPILED: Dict[str, Any] = {}


def _compile(source: str) -> Any:
    if source not in _COMPILED:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        _COMPILED[source] = env.from_string(source)
    return _COMPILED[source]


class NotJSON(ValueError):
    """What `strict_json` refuses although Python's json module reads it; `msg` says what, for the policy."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


def _refuse_constant(name: str) -> Any:
    raise NotJSON(f"{name} is not a JSON number; write a number or a string")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: float() gives inf, which no JSON encoder writes back
        raise NotJSON(f"the number {text[:40]} is too large for a JSON number (a double)")
    return value


def strict_json(text: str) -> Any:
    """`json.loads(text)` as RFC 8259 / I-JSON read it: NaN, Infinity, -Infinity and numbers beyond a double
    (Python's json reads them as float nan / inf, which JSON cannot carry: a tool server request or the reward
    server's `turns` would then fail to serialize) and strings holding a lone surrogate (`"\\ud800"`: not a
    character; UTF-8 cannot encode it, so a tokenizer fails on it) raise NotJSON (a ValueError) saying which."""
    data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    bad = _lone_surrogate(data)
    if bad is not None:
        raise NotJSON(f"the string {json.dumps(bad[:40])} holds a lone surrogate ({_surrogate_escape(bad)}), which "
                      "is half of a UTF-16 pair, not a character")
    return data


def _lone_surrogate(value: Any) -> Optional[str]:
    """The first string (key or value) in a decoded JSON value that UTF-8 cannot encode, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _surrogate_escape(text: str) -> str:
    first = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    return f"\\u{ord(first):04x}"


def _mark(value: Any, pattern: "re.Pattern[str]", opening: str, closing: str) -> Any:
    """`value` (decoded JSON) with every match of `pattern` in its strings, keys too, between opening and
    closing."""
    if isinstance(value, str):
        return pattern.sub(lambda m: opening + m.group(0) + closing, value)
    if isinstance(value, dict):
        return {_mark(k, pattern, opening, closing): _mark(v, pattern, opening, closing) for k, v in value.items()}
    if isinstance(value, list):
        return [_mark(v, pattern, opening, closing) for v in value]
    return value


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
