"""The local control plane's ports: chosen outside the ephemeral range (outgoing
connections take their source ports from it, and one took the controller-manager's port in
CI), and moved when another process holds one at start."""

from __future__ import annotations

import socket
import sys
import textwrap
import time
from pathlib import Path

from dradriver_dev import cluster, ports

# A component as the control plane's are: serves /healthz over TLS on --secure-port, and
# exits saying so when the port is taken, as Go's net.Listen words it.
COMPONENT = textwrap.dedent(
    """
    import http.server, ssl, sys
    port = int(next(a for a in sys.argv if a.startswith("--secure-port=")).split("=")[1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    try:
        srv = http.server.HTTPServer(("127.0.0.1", port), H)
    except OSError:
        print(f"listen tcp 127.0.0.1:{port}: bind: address already in use", flush=True)
        sys.exit(1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()
    """
)


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = ports.free_ports(20)
    assert len(set(chosen)) == 20
    assert all(10000 <= p < low for p in chosen)
    for p in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_component_whose_port_is_taken_gets_another(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    cluster._make_pki(tmp_path / "pki")
    script = tmp_path / "component.py"
    script.write_text(COMPONENT)
    argv = [
        sys.executable,
        str(script),
        *(str(tmp_path / "pki" / f) for f in ("apiserver.crt", "apiserver.key")),
    ]
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports.free_port()))
    squatter.listen()
    taken = squatter.getsockname()[1]
    st = cluster.ClusterState(
        state_dir=str(tmp_path),
        bin_dir="",
        kubeconfig="",
        server="",
        alpha=False,
        ports={"component": taken},
    )
    try:
        cluster._start_serving(st, {"comp": ("component", argv)}, deadline=time.monotonic() + 30)
        assert st.ports["component"] != taken
        assert cluster.ClusterState.load(tmp_path) == st  # the new port is what `down` reads
        assert "address already in use" in (tmp_path / "logs" / "comp.log").read_text()
    finally:
        squatter.close()
        if "comp" in st.pids:
            cluster._stop(st.pids["comp"])
