# Attacks: the kernel's attack surface beyond the old deny list. Calls each system call
# the allowlist leaves out (x86_64 numbers), one far above the newest the policy knows,
# and socket() of families and protocols whose kernel modules a run must never load.
# Expect: each call ENOSYS, each family EAFNOSUPPORT, each protocol EPROTONOSUPPORT,
# and the netlink route socket glibc's resolver uses still opens.
import ctypes, json, platform, socket, sys
if platform.machine() != "x86_64":
    sys.exit("this fixture knows x86_64 syscall numbers only")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()


calls = {
    "modify_ldt": (154, 0, 0, 0),
    "kcmp": (312, 1, 1, 0, 0, 0),                 # KCMP_FILE of our own pid
    "personality": (135, 0x0400000),              # READ_IMPLIES_EXEC
    "mbind": (237, 0, 4096, 0, 0, 0, 0),
    "set_mempolicy": (238, 0, 0, 0),
    "move_pages": (279, 0, 0, 0, 0, 0, 0),
    "migrate_pages": (256, 0, 0, 0, 0),
    "process_madvise": (440, 0, 0, 0, 0, 0),
    "memfd_secret": (447, 0),
    "statmount": (457, 0, 0, 0, 0),
    "listmount": (458, 0, 0, 0, 0),
    "lsm_get_self_attr": (459, 0, 0, 0, 0),
    "lsm_list_modules": (461, 0, 0, 0),
    "mseal": (462, 0, 0, 0),
    "open_tree_attr": (467, -100, 0, 0, 0, 0),
    "above_the_policy": (1000,),
}
out = {name: call(nr, *args) for name, (nr, *args) in calls.items()}
# The default persona can still be read and set.
out["personality_query"] = call(135, 0xFFFFFFFF)

families = {
    "AF_ALG": (38, socket.SOCK_SEQPACKET, 0),
    "AF_PACKET": (17, socket.SOCK_RAW, 0),
    "AF_TIPC": (30, socket.SOCK_RDM, 0),
    "AF_RDS": (21, socket.SOCK_SEQPACKET, 0),
    "AF_CAN": (29, socket.SOCK_RAW, 1),
    "AF_BLUETOOTH": (31, socket.SOCK_STREAM, 0),
    "AF_KEY": (15, socket.SOCK_RAW, 2),
    "AF_X25": (9, socket.SOCK_SEQPACKET, 0),
    "AF_APPLETALK": (5, socket.SOCK_DGRAM, 0),
    "AF_RXRPC": (33, socket.SOCK_DGRAM, 2),
    "AF_XDP": (44, socket.SOCK_RAW, 0),
    "AF_SMC": (43, socket.SOCK_STREAM, 0),
    "AF_VSOCK_pair": (40, socket.SOCK_STREAM, 0, "pair"),
    "AF_NETLINK_pair": (16, socket.SOCK_RAW, 0, "pair"),
}
protocols = {
    "SCTP": (socket.AF_INET, socket.SOCK_STREAM, 132),
    "SCTP6": (socket.AF_INET6, socket.SOCK_SEQPACKET, 132),
    "DCCP": (socket.AF_INET, 6, 33),              # SOCK_DCCP, IPPROTO_DCCP
    "UDPLITE": (socket.AF_INET, socket.SOCK_DGRAM, 136),
    "L2TP": (socket.AF_INET, socket.SOCK_DGRAM, 115),
    "NETLINK_AUDIT": (16, socket.SOCK_RAW, 9),
    "NETLINK_NETFILTER": (16, socket.SOCK_RAW, 12),
    "NETLINK_KOBJECT_UEVENT": (16, socket.SOCK_DGRAM, 15),
    "NETLINK_XFRM": (16, socket.SOCK_RAW, 6),
}


def socket_errno(family, kind, proto, pair=None):
    if pair:
        fds = (ctypes.c_int * 2)()
        ctypes.set_errno(0)
        r = libc.socketpair(family, kind, proto, fds)
    else:
        ctypes.set_errno(0)
        r = libc.socket(family, kind, proto)
    return 0 if r >= 0 else ctypes.get_errno()


out["families"] = {name: socket_errno(*a) for name, a in families.items()}
out["protocols"] = {name: socket_errno(*a) for name, a in protocols.items()}
allowed = {
    "NETLINK_ROUTE": (16, socket.SOCK_RAW, 0),
    "AF_UNIX": (socket.AF_UNIX, socket.SOCK_STREAM, 0),
    "AF_UNIX_pair": (socket.AF_UNIX, socket.SOCK_STREAM, 0, "pair"),
    "TCP": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "TCP6": (socket.AF_INET6, socket.SOCK_STREAM, 6),
    "UDP": (socket.AF_INET, socket.SOCK_DGRAM, 17),
}
out["allowed"] = {name: socket_errno(*a) for name, a in allowed.items()}
# glibc's interface listing goes over the route socket.
out["if_nameindex"] = [name for _, name in socket.if_nameindex()]
print(json.dumps(out))
