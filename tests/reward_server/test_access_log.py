"""The access log as a real server writes it (`python -m reward_server`, its stderr read back): what a request
sends (its path, its method) cannot write a line or a field of its own; and log_field's escapes, one by one."""
import re
import socket

import requests

from reward_server import log_field

LINE_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")  # logging.basicConfig's format
FORGED = "request_id=forged method=POST path=/ status=200 batch=64 latency_ms=1.0"


def raw_request(port, request_line):
    """Send one request as raw bytes (requests would quote the path) and return the reply's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request_line + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return b"".join(iter(lambda: sock.recv(4096), b"")).split(b"\r\n", 1)[0]


def test_a_request_cannot_forge_a_log_line(start_cli, free_port):
    port = free_port()
    proc = start_cli(port, "--reward", "kk")
    url = f"http://127.0.0.1:{port}"
    forged_path = "/x%0A" + FORGED.replace(" ", "%20")
    assert requests.get(url + forged_path, timeout=10).status_code == 404
    # Other line breaks a log viewer (or Python's splitlines) honours: CR, NEL, the Unicode line separator.
    assert requests.get(url + "/y%0D%C2%85%E2%80%A8" + FORGED.replace(" ", "%20"), timeout=10).status_code == 404
    assert raw_request(port, b"GET /z" + b"%20status=200" * 30 + b" HTTP/1.1").startswith(b"HTTP/1.1 404")
    proc.terminate()
    proc.wait(10)
    log = proc.log_path.read_text(encoding="utf-8")
    lines = log.splitlines()
    assert [line for line in lines if not LINE_START.match(line)] == []  # every line is one the logger began
    access = [line.split("reward_server.access: ", 1)[1] for line in lines if "reward_server.access: " in line]
    mine = [line for line in access if "path=/health" not in line]
    assert len(mine) == 3, mine
    assert mine[0].startswith("request_id=") and " method=GET path=/x\\x0arequest_id=forged\\x20method=POST\\x20" \
                                                  "path=/\\x20status=200\\x20batch=64\\x20latency_ms=1.0 status=404 " \
                                                  "batch=0 latency_ms=" in mine[0]
    assert " path=/y\\x0d\\x85\\u2028request_id=forged\\x20" in mine[1]
    # 200 characters of the path kept ("/z" and 18 of 30 " status=200"), escaped; the cut marked.
    assert " path=/z" + "\\x20status=200" * 18 + "...[len=332] status=404 batch=0 " in mine[2]
    assert [len(line.split(" ")) for line in mine] == [6, 6, 6]  # request_id method path status batch latency_ms


def test_log_field_escapes():
    assert log_field("/ok/path-1.2_3~") == "/ok/path-1.2_3~"
    assert log_field("/a b\tc\nd\re") == "/a\\x20b\\x09c\\x0ad\\x0de"
    assert log_field('\\"') == "\\x5c\\x22"  # so an escape in the log is always the server's
    assert log_field("\x85\u2028\u2029\x00\x7f") == "\\x85\\u2028\\u2029\\x00\\x7f"
    assert log_field("é\U0001F600\U000E0001") == "é\U0001F600\\U000e0001"  # printable kept, a tag character not
    assert log_field("x" * 201) == "x" * 200 + "...[len=201]"
