"""Who may use the server, tried as an attacker would on real servers (waitress on a free loopback port, and the CLI
as a subprocess): a token before any code-running tool is served, JSON bodies only (a web page cannot send them
without a CORS preflight), the Host header checked against the bind address (DNS rebinding), cross-origin requests
refused (an Origin must be the Host's own host and port, through a TLS proxy too; a browser's Sec-Fetch-Site must say
same-origin or none), the token's sources (environment, file, command line) and a malformed Authorization header."""
import json
import os
import subprocess
import sys

import pytest
import requests

from reward_server import InsecureServerError, create_app, tools_needing_a_token
from reward_server.__main__ import parse_args

from paddle_grpo.environment import ToolSet, load_tools

BATCH = {"src": ["q"], "tgt": ["(1) Ann is a knight"],
         "response": ["<think>x</think><answer>Ann is a knight</answer>"]}
RUN_CODE = {"name": "python", "arguments": {"code": "import os; print(os.getuid(), os.getcwd())"}}
JSON = {"Content-Type": "application/json"}
# What a web page's fetch() may send without a CORS preflight: a "simple" request.
BROWSER = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"}


def post(url, body, headers):
    return requests.post(url, data=json.dumps(body), headers=headers, timeout=30)


def refused(origin, host):
    """The status and error_msg of a request from a page at `origin` sent with the Host header `host`."""
    return (403, f"request from a web page ({origin!r}) refused: this server answers programs, not browsers (a "
                 f"request with an Origin must come from the host and port it is sent to, Host {host!r})")


# Item: a code-running tool needs a token.

def test_a_tool_that_runs_code_is_not_served_without_a_token():
    with pytest.raises(InsecureServerError, match=r"^serving python needs a token: anyone who can reach the port "
                                                  r"could run code as this server's user"):
        create_app([], tools="calculator,python")
    create_app([], tools="calculator")  # pure arithmetic: no token needed, as before
    create_app([], tools="calculator,python", token="T0k")
    create_app([], tools="python", insecure_no_token=True)
    assert tools_needing_a_token(load_tools("calculator,python")) == ["python"]

    def lookup(key: str) -> str:
        """A tool of the user's own: the server cannot tell what it does."""
        return key

    assert tools_needing_a_token(ToolSet([*load_tools("calculator").tools.values(),
                                          *load_tools([lookup]).tools.values()])) == ["lookup"]


def run_cli(repo_root, *args, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "REWARD_SERVER_TOKEN"}
    env.update(env_extra or {}, PYTHONPATH=str(repo_root))
    return subprocess.run([sys.executable, "-m", "reward_server", "--port", "0", *args], cwd=str(repo_root),
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_cli_refuses_python_without_a_token(repo_root):
    done = run_cli(repo_root, "--tool", "python")
    assert done.returncode == 2
    assert done.stderr.startswith("reward_server: serving python needs a token: anyone who can reach the port could "
                                  "run code as this server's user. Set one in $REWARD_SERVER_TOKEN or a file "
                                  "(--token-file)"), done.stderr
    assert "--insecure-no-token" in done.stderr


def test_cli_with_the_loud_opt_out_serves_python_and_says_so(start_cli, free_port):
    port = free_port()
    proc = start_cli(port, "--tool", "python", "--insecure-no-token")
    reply = post(f"http://127.0.0.1:{port}/tool", {"name": "python", "arguments": {"code": "print(6*7)"}}, JSON)
    assert reply.json()["content"] == "42\n"
    proc.terminate()
    proc.wait(10)
    assert f"--insecure-no-token: anyone who can reach port {port} can run code as this user through python" in \
        proc.log_path.read_text()


@pytest.mark.parametrize("source", ["env", "file"])
def test_token_from_the_environment_or_a_file(start_cli, free_port, tmp_path, source):
    # The ways that keep the token out of `ps`: the server's command line holds no token.
    port = free_port()
    token = f"{source}-T0k"
    if source == "env":
        proc = start_cli(port, "--tool", "python", env={"REWARD_SERVER_TOKEN": token})
    else:
        path = tmp_path / "token"
        path.write_text(token + "\n")
        os.chmod(path, 0o600)
        proc = start_cli(port, "--tool", "python", "--token-file", str(path))
    with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
        assert token.encode() not in f.read()
    url = f"http://127.0.0.1:{port}/tool"
    assert post(url, RUN_CODE, JSON).status_code == 401
    ok = post(url, {"name": "python", "arguments": {"code": "print(6*7)"}},
              {**JSON, "Authorization": f"Bearer {token}"})
    assert ok.json()["content"] == "42\n"


def test_token_file_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for argv, message in [(["--token-file", str(empty)], f"--token-file: {empty} is empty (its first line is the "
                                                         "token)"),
                          (["--token-file", str(tmp_path / "missing")],
                           f"--token-file: cannot read {tmp_path / 'missing'}: No such file or directory"),
                          (["--token", "a", "--token-file", str(empty)], "give the token once: --token or "
                                                                          "--token-file")]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert capsys.readouterr().err.rstrip().endswith(message), argv


def test_a_token_on_the_command_line_is_warned_about(start_cli, free_port):
    port = free_port()
    proc = start_cli(port, "--reward", "kk", "--token", "T0k")
    proc.terminate()
    proc.wait(10)
    assert "the token is on the command line, where any local user can read it (ps); prefer $REWARD_SERVER_TOKEN " \
           "or --token-file" in proc.log_path.read_text()


# Items: JSON only, the Host header, cross-origin requests, a malformed Authorization header.

@pytest.fixture
def tool_server(serve):
    return serve(create_app("kk", tools="calculator,python", token="T0k"))


@pytest.fixture
def reward_server(serve):
    return serve(create_app("kk"))  # PaddleNLP's reward clients send no token: none is needed on loopback


def test_browser_style_requests_are_refused(tool_server, reward_server):
    # A web page's text/plain POST (no CORS preflight needed): refused before anything runs, token or not.
    for headers in (BROWSER, {**BROWSER, "Authorization": "Bearer T0k"}):
        reply = post(tool_server.url + "/tool", RUN_CODE, headers)
        assert (reply.status_code, reply.json()["error_msg"]) == refused("http://evil.example",
                                                                         f"127.0.0.1:{tool_server.port}")
    no_origin = {"Content-Type": "text/plain", "Authorization": "Bearer T0k"}
    for url in (tool_server.url + "/tool", reward_server.url + "/"):
        reply = post(url, RUN_CODE if url.endswith("/tool") else BATCH, no_origin)
        assert (reply.status_code, reply.json()["error_msg"]) == (
            415, "Content-Type must be application/json, got 'text/plain'")
    form = requests.post(reward_server.url + "/", data={"src": "q"}, timeout=10)  # an HTML form's POST
    assert (form.status_code, form.json()["error_msg"]) == (
        415, "Content-Type must be application/json, got 'application/x-www-form-urlencoded'")
    bare = requests.post(reward_server.url + "/", data=json.dumps(BATCH).encode(), timeout=10,
                         headers={"Content-Type": ""})
    assert (bare.status_code, bare.json()["error_msg"]) == (
        415, "Content-Type must be application/json (the request has none)")


def test_json_clients_still_work(tool_server, reward_server):
    # What PaddleNLP's reward client and this project's clients send: application/json (charset allowed).
    reply = requests.post(reward_server.url + "/", json=BATCH, timeout=30)
    assert reply.status_code == 200 and reply.json()["score"] == [3.0]
    reply = post(reward_server.url + "/", BATCH, {"Content-Type": "application/json; charset=utf-8"})
    assert reply.json()["score"] == [3.0]
    reply = post(tool_server.url + "/tool", {"name": "python", "arguments": {"code": "print(6*7)"}},
                 {**JSON, "Authorization": "Bearer T0k"})
    assert reply.json()["content"] == "42\n"


def test_a_foreign_host_header_is_refused(tool_server, reward_server):
    # DNS rebinding: a page at attacker.example whose name now resolves to 127.0.0.1 sends Host: attacker.example.
    port = tool_server.port
    for url, path, body in ((tool_server.url, "/tool", RUN_CODE), (reward_server.url, "/", BATCH),
                            (tool_server.url, "/health", None)):
        headers = {**JSON, "Authorization": "Bearer T0k", "Host": f"attacker.example:{port}"}
        reply = requests.get(url + path, headers=headers, timeout=10) if body is None else \
            post(url + path, body, headers)
        assert (reply.status_code, reply.json()["error_msg"]) == (
            421, f"Host header 'attacker.example:{port}' is not a name this server answers to; start it with "
                 "--allowed-hosts NAME to answer to another name"), path
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST.", f"[::1]:{port}"):
        assert requests.get(tool_server.url + "/health", headers={"Host": host}, timeout=10).status_code == 200, host


def test_allowed_hosts_and_a_wildcard_bind(serve):
    named = serve(create_app("kk", allowed_hosts=["gpu-box.lan"]))
    assert requests.get(named.url + "/health", headers={"Host": "gpu-box.lan:1"}, timeout=10).status_code == 200
    assert requests.get(named.url + "/health", headers={"Host": "other.lan"}, timeout=10).status_code == 421
    anything = serve(create_app("kk", allowed_hosts=["*"]))
    assert requests.get(anything.url + "/health", headers={"Host": "other.lan"}, timeout=10).status_code == 200
    # An app told it is bound to 0.0.0.0 (served here on loopback): IP addresses pass, foreign names do not.
    wildcard = serve(create_app("kk", host="0.0.0.0"))
    for host, status in (("10.1.2.3:8731", 200), ("[fe80::1]:8731", 200), ("attacker.example:8731", 421)):
        assert requests.get(wildcard.url + "/health", headers={"Host": host}, timeout=10).status_code == status
    specific = serve(create_app("kk", host="10.1.2.3"))
    for host, status in (("10.1.2.3:8731", 200), ("10.9.9.9:8731", 421), ("localhost", 200)):
        assert requests.get(specific.url + "/health", headers={"Host": host}, timeout=10).status_code == status


def test_an_origin_of_this_server_is_accepted(reward_server):
    # A same-origin Origin (a tool page served from this very host, or curl -H Origin) is not a foreign page.
    headers = {**JSON, "Origin": f"http://127.0.0.1:{reward_server.port}"}
    assert post(reward_server.url + "/", BATCH, headers).status_code == 200
    assert post(reward_server.url + "/", BATCH, {**JSON, "Origin": "null"}).status_code == 403


def test_a_misdirected_host_stops_the_tool_client_instead_of_failing_calls(serve):
    # A Host the server does not answer to stops the trainer's RemoteToolSet at start-up (GET /tools) with the
    # server's reason. (The status is 421, not 400: on POST /tool the client reads a 400 as the policy's bad
    # arguments, which a refused request is not.)
    from paddle_grpo.environment import ToolServerError, load_tools

    # An app that answers to 127.0.0.1 only, reached at 127.0.0.2 (loopback too: all of 127/8 is).
    server = serve(create_app([], tools="calculator", host="127.0.0.1"), host="127.0.0.2")
    with pytest.raises(ToolServerError, match="answered HTTP 421: Host header '127.0.0.2:"):
        load_tools("calculator", server=server.url)


def test_attacker_summary(tool_server):
    # The review's attempts in one place, each answered before any code runs: (status, error_msg's start).
    url = tool_server.url + "/tool"
    attempts = {
        "text/plain from a page": (BROWSER, 403),
        "JSON from a page on another local port": ({**JSON, "Authorization": "Bearer T0k",
                                                    "Origin": "http://localhost:3000"}, 403),
        "JSON from a sandboxed page": ({**JSON, "Authorization": "Bearer T0k", "Origin": "null"}, 403),
        "a browser's cross-site request without Origin": ({**JSON, "Authorization": "Bearer T0k",
                                                           "Sec-Fetch-Site": "cross-site"}, 403),
        "foreign Host": ({**JSON, "Authorization": "Bearer T0k", "Host": "attacker.example"}, 421),
        "no token": (JSON, 401),
        "wrong token": ({**JSON, "Authorization": "Bearer nope"}, 401),
        "no Bearer": ({**JSON, "Authorization": "T0k"}, 401),
    }
    for what, (headers, status) in attempts.items():
        assert post(url, RUN_CODE, headers).status_code == status, what


# Item: an Origin is answered only when it is this server itself (host and port), a browser's Sec-Fetch-Site only
# when it says same-origin (or none: the user typed the URL).

def test_a_page_on_another_port_of_this_host_is_refused(tool_server, reward_server):
    # Before, only host names were compared: a page from another port of this machine (a dev server on
    # localhost:3000, anything on 127.0.0.1) passed. So did Origin null with --allowed-hosts '*' (below).
    port = reward_server.port
    host = f"127.0.0.1:{port}"
    for origin in ("http://localhost:3000", "http://127.0.0.1:9999", "http://127.0.0.1", "https://127.0.0.1",
                   "null", "file://", f"http://127.0.0.1:{port}/", "chrome-extension://abcdef"):
        reply = post(reward_server.url + "/", BATCH, {**JSON, "Origin": origin})
        assert (reply.status_code, reply.json()["error_msg"]) == refused(origin, host), origin
        reply = requests.get(reward_server.url + "/health", headers={"Origin": origin}, timeout=10)
        assert (reply.status_code, reply.json()["error_msg"]) == refused(origin, host), origin
    # The token does not help a page (it cannot know it, but a refused request never reaches the tool anyway).
    reply = post(tool_server.url + "/tool", RUN_CODE,
                 {**JSON, "Authorization": "Bearer T0k", "Origin": "http://localhost:3000"})
    assert (reply.status_code, reply.json()["error_msg"]) == refused("http://localhost:3000",
                                                                     f"127.0.0.1:{tool_server.port}")
    # IPv6: the brackets are the URL's, not the address's.
    for origin, status in ((f"http://[::1]:{port}", 200), ("http://[::1]:3000", 403), (f"http://[::2]:{port}", 403)):
        reply = requests.get(reward_server.url + "/health", headers={"Origin": origin, "Host": f"[::1]:{port}"},
                             timeout=10)
        assert reply.status_code == status, origin


def test_any_host_allowed_still_needs_a_same_origin_origin(serve):
    # --allowed-hosts '*' answers every Host, not every Origin: before, it let every Origin through, null included.
    server = serve(create_app("kk", allowed_hosts=["*"]))
    host = f"127.0.0.1:{server.port}"
    for origin in ("http://evil.example", "null"):
        reply = post(server.url + "/", BATCH, {**JSON, "Origin": origin})
        assert (reply.status_code, reply.json()["error_msg"]) == refused(origin, host), origin
    assert post(server.url + "/", BATCH, {**JSON, "Origin": f"http://{host}"}).status_code == 200
    reply = post(server.url + "/", BATCH, {**JSON, "Origin": "http://other.lan", "Host": "other.lan"})
    assert reply.status_code == 200  # a Host of any name is answered, and this Origin is that host's own
    # A wildcard bind answers any IP address, not a page on another port of it.
    wildcard = serve(create_app("kk", host="0.0.0.0"))
    for origin, status in (("http://10.1.2.3:3000", 403), ("http://10.1.2.3:8731", 200)):
        reply = post(wildcard.url + "/", BATCH, {**JSON, "Origin": origin, "Host": "10.1.2.3:8731"})
        assert reply.status_code == status, origin


@pytest.mark.parametrize("host, origin, status", [
    # A TLS proxy that passes the client's Host on: the browser spoke https to it, so a Host without a port means
    # 443, the default port of an https Origin. The server behind it speaks plain HTTP and cannot see the scheme
    # itself (waitress drops an untrusted X-Forwarded-Proto), so a Host without a port takes the Origin's scheme.
    ("toolhost", "https://toolhost", 200),
    ("toolhost", "http://toolhost", 200),             # plain HTTP on port 80
    ("toolhost:443", "https://toolhost", 200),        # a client that names the default port
    ("toolhost:80", "http://toolhost", 200),
    ("toolhost:443", "http://toolhost", 403),         # reached on 443, the page is on port 80
    ("toolhost:80", "https://toolhost", 403),         # reached on 80, the page is on 443
    ("toolhost", "https://toolhost:8443", 403),       # a page on another port
    ("toolhost", "http://toolhost:443", 403),         # port 443 on an http Origin: not the Host's port 80
    ("toolhost:8443", "https://toolhost:8443", 200),  # explicit ports compare as given
    ("toolhost:8443", "https://toolhost", 403),
    ("TOOLHOST.", "https://toolhost", 200),           # names compare as the Host check compares them
    ("toolhost", "https://evil.example", 403),
])
def test_same_origin_through_a_tls_proxy_that_passes_the_host_on(serve, host, origin, status):
    server = serve(create_app("kk", allowed_hosts=["toolhost"]))
    reply = post(server.url + "/", BATCH, {**JSON, "Host": host, "Origin": origin})
    assert reply.status_code == status, reply.text
    if status == 403:
        assert reply.json()["error_msg"] == refused(origin, host)[1]
    forwarded = post(server.url + "/", BATCH, {**JSON, "Host": host, "Origin": origin, "X-Forwarded-Proto": "http"})
    assert forwarded.status_code == status  # an X-Forwarded-Proto changes nothing: waitress drops it (untrusted)


def test_a_request_a_browser_marks_as_from_another_site_is_refused(reward_server):
    # A page's GET without CORS (an <img>, fetch(url, {mode: "no-cors"})) carries no Origin; browsers (Chrome 76,
    # Firefox 90, Safari 16.4 on) mark every request with Sec-Fetch-Site, which a page cannot set. same-site
    # includes another port of this host (a site ignores ports).
    for value, status in (("cross-site", 403), ("same-site", 403), ("bogus", 403), ("same-origin", 200),
                          ("none", 200)):  # none: the user typed the URL or opened a bookmark
        reply = requests.get(reward_server.url + "/health", headers={"Sec-Fetch-Site": value}, timeout=10)
        assert reply.status_code == status, value
        if status == 403:
            assert reply.json()["error_msg"] == (f"request from a web page (Sec-Fetch-Site: {value}) refused: this "
                                                 "server answers programs, not browsers"), value
    reply = post(reward_server.url + "/", BATCH, {**JSON, "Sec-Fetch-Site": "same-site"})
    assert reply.status_code == 403
