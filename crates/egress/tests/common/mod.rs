//! What both of the crate's test files start: the proxy of a run, on loopback.

use sandcall_egress::RunEgress;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The proxy for `run`, listening on loopback.
pub async fn start_proxy(run: &Arc<RunEgress>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let run = run.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let run = run.clone();
            tokio::spawn(async move { run.serve(stream).await });
        }
    });
    addr
}
