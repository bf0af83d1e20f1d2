"""What the project's HTTP clients share (rewards/client.py, environment/client.py): a failure in one line, the
server's error_msg of a rejected request, and the backoff between retries. Imports nothing of the package."""
import random
import re
from typing import Any

# 408 and 429 are 4xx but mean "try again later"; other 4xx mean the request itself is wrong.
RETRYABLE_4XX = (408, 429)


def short_error(exc: BaseException) -> str:
    """`Type: message` of a transport failure, at most 200 characters of the message."""
    text = str(exc)
    # requests buries the useful part ("[Errno 111] Connection refused") at the end of a long message.
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if errno:
        text = errno.group(0).strip()
    return f"{type(exc).__name__}: {text[:200]}"


def error_msg(reply: Any) -> str:
    """The `error_msg` of a JSON error body (the reward server's protocol), else the start of the body's text."""
    try:
        body = reply.json()
        if isinstance(body, dict) and "error_msg" in body:
            return str(body["error_msg"])[:500]
    except ValueError:
        pass
    return reply.text[:200].strip() or reply.reason or "(empty body)"


def backoff_delay(attempt: int, backoff: float, max_backoff: float) -> float:
    """Seconds before retry `attempt` (0-based): backoff * 2**attempt capped at max_backoff, with +-20 % jitter so
    many trainer ranks do not retry in lockstep."""
    return min(backoff * 2 ** attempt, max_backoff) * random.uniform(0.8, 1.2)
