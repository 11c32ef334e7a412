//! A run granted network tries every way out but the proxy (`egress_escape.py`).

use crate::common::{hostile, Server};
use serde_json::json;

#[test]
fn a_run_with_network_has_no_way_out_but_the_proxy() {
    let s = Server::start_with(
        &[],
        "egress_allow = [\"localhost:80\"]\negress_principals = [\"*\"]\negress_allow_addresses = [\"127.0.0.1/32\"]\n",
    );
    let egress_dir = s.data_dir.join("egress");
    let r = s.exec(json!({
        "code": hostile("egress_escape.py"),
        "args": [s.port.to_string(), egress_dir.to_str().unwrap(), "localhost", "22"],
        "network": {},
        "timeout": 60000,
    }));
    let v: serde_json::Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {r}"));
    for attempt in [
        "dns_loopback",
        "dns_host",
        "dns_public",
        "getaddrinfo",
        "raw_socket",
        "packet_socket",
        "udp_out",
        "tcp_out",
        "tcp_host_resolver",
        "loopback_server_port",
        "loopback_ssh",
        "proxy_host_socket",
        "egress_channel",
    ] {
        assert!(v[attempt].as_str().unwrap().starts_with("refused"), "{attempt}: {v}");
    }
    assert_eq!(v["proxy_port"], "ok: connected", "{v}");
    assert_eq!(v["egress_dir_visible"], false, "{v}");
    assert_eq!(v["connect_bad_port"], "ok: HTTP/1.1 403 Forbidden", "{v}");
    // The refused CONNECT is the run's one connection, refused.
    assert_eq!(r["network"]["refused"], 1, "{r}");
    s.assert_healthy();
}
