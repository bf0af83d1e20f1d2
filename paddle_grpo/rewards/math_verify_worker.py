"""Child process that runs math-verify for the parent's `MathVerifyPool`; run as a script, not imported.

Protocol on stdin/stdout, one JSON object per line:
    {"gold": "72", "pred": "\\\\boxed{72}"}   ->   {"ok": true}   or   {"error": "what failed"}
math-verify's own timeouts use signal.alarm, which fails outside the main thread of the parent (a threaded WSGI
server); here they are switched off and the parent enforces the time limit by killing this process, which is the
only way to stop a runaway sympy computation. The worker exits when stdin closes (the parent went away).
"""
import json
import logging
import sys


def limit_memory(max_bytes: int) -> None:
    """Cap the address space so an exploding expression fails with MemoryError instead of swapping the host."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > max_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (max_bytes, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: the parent's time limit still holds
        pass


def main() -> None:
    max_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if max_mb > 0:
        limit_memory(max_mb * 1024 * 1024)
    # math-verify warns once that timeouts are disabled; that is deliberate here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold = parse(request["gold"], parsing_timeout=None)
            pred = parse(request["pred"], parsing_timeout=None)
            reply = {"ok": bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))}
        except BaseException as exc:  # MemoryError, RecursionError from sympy: report, keep serving
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
