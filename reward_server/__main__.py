"""`python -m reward_server --host 127.0.0.1 --port 8731 --reward kk,tag_format --weights 1,0.5`
(a token in $REWARD_SERVER_TOKEN or `--token-file FILE` requires `Authorization: Bearer TOKEN`; `--reward-model DIR`
serves a reward model too, `--tool calculator,python` tools (alone or beside rewards); example requests in
docs/rewards.md and docs/tools.md)

Serves the reward functions (and tools) over HTTP with waitress (multi-threaded; no lock around scoring but a reward
model's forward passes, which run one at a time). Binds to 127.0.0.1 unless --host says otherwise. Serving any tool
but the calculator (`python` runs code) needs a token unless --insecure-no-token is given. Every request's Host
header must name this server (--allowed-hosts adds names) and POST bodies must be application/json: a web page
cannot use the server. The token travels in plain HTTP: across machines, put TLS in front (docs/tools.md).
"""
import argparse
import logging
import os
import sys
from typing import List, Union

from paddle_grpo.environment import sandbox
from paddle_grpo.rewards import RewardModel

from . import DEFAULT_TIMEOUT_S, InsecureServerError, create_app, tools_needing_a_token
from .serving import CONNECTION_LIMIT, make_server

logger = logging.getLogger("reward_server")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m reward_server", description=__doc__.split("\n\n")[1])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=8731, help="port (default 8731; 0 picks a free one)")
    parser.add_argument("--reward", default=None,
                        help="comma-separated reward names or module:function / file.py:function specs "
                             "(default kk, or none when --reward-model or --tool is given)")
    parser.add_argument("--reward-model", default=None, metavar="DIR",
                        help="a sequence-scoring reward model (directory or hub ID) scoring src + response, after "
                             "the --reward functions; loaded at start-up")
    parser.add_argument("--reward-batch-size", type=int, default=8,
                        help="sequences per reward-model forward pass (default 8)")
    parser.add_argument("--tool", default="",
                        help="comma-separated tools to serve (GET /tools, POST /tool): names or module:function / "
                             "file.py:function specs, e.g. calculator,python; with --tool and no --reward the server "
                             "serves only tools. `python` is remote code execution for whoever holds the token: "
                             "any tool but calculator needs a token (see --insecure-no-token)")
    parser.add_argument("--weights", default=None,
                        help="comma-separated weights, one per reward, the reward model's last (default all 1)")
    parser.add_argument("--token", default=None,
                        help="require 'Authorization: Bearer TOKEN' on POST /, GET /tools and POST /tool. On the "
                             "command line any local user sees it (ps): prefer $REWARD_SERVER_TOKEN (the default) "
                             "or --token-file. It crosses the network in clear: use TLS in front across machines")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="read the token from FILE (its first line; keep the file mode 600)")
    parser.add_argument("--allowed-hosts", default="", metavar="NAMES",
                        help="comma-separated extra names a request's Host header may give (the DNS names clients "
                             "use to reach this server; '*': any). Default: the --host address and localhost; with "
                             "--host 0.0.0.0 also any IP address and this machine's host names")
    parser.add_argument("--insecure-no-token", action="store_true",
                        help="serve tools that need a token (python, your own) without one: ANYONE WHO CAN REACH "
                             "THE PORT RUNS CODE AS THIS USER (other users of this machine, containers on its "
                             "network)")
    parser.add_argument("--sandbox", default="auto", choices=("auto", "namespaces", "process"),
                        help="isolation of the python tool: auto (namespaces where they can be made: root with "
                             "CAP_SYS_ADMIN on Linux; else none, with a warning), namespaces (refuse to start "
                             "without them: what a server for untrusted code should use), process (never). As "
                             "root a snippet runs as a user of its own in every mode (docs/tools.md)")
    parser.add_argument("--threads", type=int, default=8, help="waitress worker threads (default 8)")
    parser.add_argument("--connection-limit", type=int, default=CONNECTION_LIMIT, metavar="N",
                        help=f"open connections at most; more wait until one closes (default {CONNECTION_LIMIT}; "
                             "each may use 2 open files: raise `ulimit -n` with it; docs/tools.md, Security)")
    parser.add_argument("--max-body-mb", type=float, default=100.0, help="request body limit in MB (default 100)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"time limit per reward-function or tool call; 0 disables (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO; WARNING hides access logs)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.connection_limit < 1:
        parser.error("--connection-limit must be >= 1")
    if args.max_body_mb <= 0:
        parser.error("--max-body-mb must be positive")
    if args.reward_batch_size < 1:
        parser.error("--reward-batch-size must be >= 1")
    if args.reward is None:
        args.reward = "" if args.reward_model or args.tool.strip() else "kk"
    if args.token is not None and args.token_file is not None:
        parser.error("give the token once: --token or --token-file")
    # Every source is stripped on both sides (a token pasted or exported with a newline or spaces would start the
    # server and then refuse every caller), and one left empty refuses the start; an empty $REWARD_SERVER_TOKEN is
    # unset (as for the trainer's reward_server_token).
    args.token_source = "--token" if args.token is not None else None
    if args.token is not None:
        args.token = args.token.strip()
        if not args.token:
            parser.error("--token is empty or only whitespace: give the token, or leave --token out")
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                args.token = f.readline().strip()
        except OSError as exc:
            parser.error(f"--token-file: cannot read {args.token_file}: {exc.strerror}")
        if not args.token:
            parser.error(f"--token-file: {args.token_file} is empty (its first line is the token)")
        args.token_source = "--token-file"
    elif args.token is None and os.environ.get("REWARD_SERVER_TOKEN"):
        args.token, args.token_source = os.environ["REWARD_SERVER_TOKEN"].strip(), "$REWARD_SERVER_TOKEN"
        if not args.token:
            parser.error("$REWARD_SERVER_TOKEN is only whitespace: set it to the token, or unset it")
    args.allowed_hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    return args


def build_rewards(args: argparse.Namespace) -> List[Union[str, RewardModel]]:
    """The reward functions the server runs: --reward's, then the --reward-model (loaded now, so a bad model stops
    the start with its reason rather than failing every request)."""
    items = [name.strip() for name in args.reward.split(",") if name.strip()]
    if args.reward_model:
        items.append(RewardModel(args.reward_model, batch_size=args.reward_batch_size).load())
    return items


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    max_bytes = int(args.max_body_mb * 1024 * 1024)
    if args.token_source == "--token":
        logger.warning("the token is on the command line, where any local user can read it (ps); prefer "
                       "$REWARD_SERVER_TOKEN or --token-file")
    try:
        sandbox.set_isolation(args.sandbox)
    except sandbox.SandboxUnavailable as exc:
        print(f"reward_server: --sandbox {args.sandbox}: {exc}", file=sys.stderr)
        return 2
    try:
        app = create_app(build_rewards(args), weights=args.weights, token=args.token,
                         max_content_length=max_bytes, timeout_s=args.timeout_s or None, tools=args.tool,
                         host=args.host, allowed_hosts=args.allowed_hosts, insecure_no_token=args.insecure_no_token)
    except InsecureServerError as exc:
        print(f"reward_server: {exc}", file=sys.stderr)
        return 2
    except (KeyError, ValueError, ImportError, AttributeError, TypeError, OSError) as exc:
        print(f"reward_server: cannot load rewards or tools: {exc}", file=sys.stderr)
        return 2
    rewards, tools = app.extensions["reward_set"], app.extensions["tool_set"]
    server = make_server(app, host=args.host, port=args.port, threads=args.threads, max_body_bytes=max_bytes,
                         connection_limit=args.connection_limit)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        logger.warning("listening on %s without a token: anyone who can reach this port can use the server",
                       args.host)
    if args.insecure_no_token and not args.token and tools_needing_a_token(tools):
        logger.warning("--insecure-no-token: anyone who can reach port %d can run code as this user through %s",
                       int(server.effective_port), ", ".join(tools_needing_a_token(tools)))
    served = (f"rewards={','.join(rewards.names)} weights={rewards.weights}" if rewards else "") + \
        (f"{' ' if rewards else ''}tools={','.join(tools.names)}" if len(tools) else "")
    logger.info("reward server listening on http://%s:%d %s threads=%d", args.host, int(server.effective_port),
                served, args.threads)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
