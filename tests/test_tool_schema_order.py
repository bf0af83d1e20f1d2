"""The same tools give the same prompt in-process and through a tool server: GET /tools keeps each schema's key
order (Flask's jsonify sorts keys), and the trainer's prompt text (step.PromptEncoder, the format's built-in text
and a jinja template's `tojson`) is compared, not only the parsed schemas. A real server (waitress) on 127.0.0.1."""
import json

import requests

from paddle_grpo.environment import HermesFormat, Tool, ToolEnvironment, ToolSet, get_tool, load_tools
from paddle_grpo.step import PromptEncoder
from reward_server import create_app

# Qwen2.5's way of listing tools in its template (the schema written with tojson), reduced to what matters here.
LISTS_TOOLS = ("{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
               "</tools><|im_end|>\n{% endif %}"
               "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def shop(zeta: str, alpha: int = 1, middle: float = 0.5) -> str:
    """Buy something.

    Args:
        zeta: what to buy.
        alpha: how many.
        middle: a discount.
    """
    return f"{alpha} {zeta}"


def tools():
    return ToolSet([get_tool("calculator"), Tool.from_function(shop)])


def test_get_tools_keeps_key_order_and_the_prompts_are_equal(serve, tool_tokenizer, monkeypatch):
    token = "schema-order-token"  # a tool of one's own is served only behind a token (docs/tools.md, Security)
    url = serve(create_app([], tools=tools(), token=token)).url
    local = tools()
    served = requests.get(url + "/tools", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()["tools"]
    # Key order is part of the text: json.dumps (which keeps it) must give the same string.
    assert [json.dumps(s) for s in served] == [json.dumps(s) for s in local.schemas()]
    assert json.dumps(served[1]).startswith('{"type": "function", "function": {"name": "shop", "description"')
    assert list(served[1]["function"]["parameters"]["properties"]) == ["zeta", "alpha", "middle"]
    remote = load_tools("calculator,shop", server=url, token=token)
    fmt = HermesFormat()
    for tok in (tool_tokenizer, None):  # the built-in Qwen2.5 text (no template) through the trainer's encoder
        texts = [PromptEncoder(None, tok, "auto", 512, ToolEnvironment(t, fmt, tool_tokenizer)).text("Buy milk.")
                 for t in (local, remote)]
        assert texts[0] == texts[1]
        assert '{"type": "function", "function": {"name": "calculator", "description": ' in texts[0]
    monkeypatch.setitem(tool_tokenizer.init_kwargs, "chat_template", LISTS_TOOLS)  # a jinja template's tojson
    local_text, remote_text = (fmt.prompt_with_tools("Buy milk.", tool_tokenizer, t.schemas()) for t in (local, remote))
    assert local_text == remote_text and '"properties": {"zeta": ' in local_text
