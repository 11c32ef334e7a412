# Attacks: the network. Tries the server's own port on loopback and an outside address,
# and lists the interfaces with their flags.
# Expect: both connections fail; the only interface is loopback, and it is down.
import fcntl, json, socket, struct, sys
port = int(sys.argv[1])
results = {}
for name, addr in [("server", ("127.0.0.1", port)), ("outside", ("1.1.1.1", 53)), ("outside6", ("2606:4700:4700::1111", 53))]:
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr)
        results[name] = "connected"
    except OSError as e:
        results[name] = f"refused: {e.errno}"
    finally:
        s.close()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
interfaces = {}
for _, ifname in socket.if_nameindex():
    flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, struct.pack("16sH", ifname.encode(), 0)))[1]
    interfaces[ifname] = bool(flags & 1)  # IFF_UP
results["interfaces"] = interfaces
print(json.dumps(results))
